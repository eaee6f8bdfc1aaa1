import Foundation
import Testing
import KeyholdCore
import KeyholdVault
import KeyholdProtocol
import KeyholdTestSupport
@testable import KeyholdBroker

/// A `put` under an application password derives its key (Argon2id) one per uid at a time: a
/// second one of the same uid while one is in flight is *busy* at once, nothing stored and the
/// refusal audited; another uid is not held up; once the first ends, the same put succeeds.
@Suite(.serialized) struct SealingReservationTests {
    static func put(_ account: String) -> Request {
        var r = Request(.put, item: ItemReference(service: "svc", account: account))
        r.secret = SecureBytes(copying: Array("v".utf8))
        r.policy = "none+app-password"
        r.appPassword = SecureBytes(copying: Array("open sesame".utf8))
        return r
    }

    @Test func aSecondSealingOfTheSameUserIsBusyAndNothingIsStored() throws {
        let h = try ReaderLookupTests.Harness()
        let uid = ReleaseGateTests.uid
        #expect(h.broker.sealing.reserve(uid))  // as if a put of this uid were deriving now
        let refused = h.session().put(Self.put("a"))
        #expect(refused.outcome == .busy)
        #expect(h.broker.withStore { (try? $0.item(owner: uid, service: "svc", account: "a")) ?? nil } == nil)
        // Another uid's sealing is not held up.
        #expect(h.broker.sealing.reserve(uid + 1))
        h.broker.sealing.release(uid + 1)
        h.broker.sealing.release(uid)
        #expect(h.session().put(Self.put("a")).outcome == .ok)
        #expect(h.broker.withStore { (try? $0.item(owner: uid, service: "svc", account: "a")) ?? nil } != nil)
        // The put let its reservation go.
        #expect(h.broker.sealing.reserve(uid))
        h.broker.sealing.release(uid)
        let outcomes = h.broker.withStore { (try? $0.auditEntries(visibleTo: uid)) ?? [] }.filter { $0.readable.operation == "put" }.map(\.readable.outcome)
        #expect(outcomes == ["busy", "ok"])
    }
}
