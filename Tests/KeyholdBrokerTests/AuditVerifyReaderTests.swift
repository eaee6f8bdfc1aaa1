import Foundation
import Synchronization
import Testing
import KeyholdCore
import KeyholdVault
import KeyholdProtocol
import KeyholdTestSupport
@testable import KeyholdBroker

/// `audit verify` reads on a read-only connection opened for it (AuditVerifyReaders.swift),
/// inside a real `Broker` on a real vault file: a verify and other callers' long reads do not
/// wait for each other, one verify per uid and two of non-root uids at a time (root has its
/// own), and every busy verify is audited.
@Suite(.serialized, .timeLimit(.minutes(3))) struct AuditVerifyReaderTests {
    typealias Harness = ReaderLookupTests.Harness
    static let (mine, other, third) = (ReleaseGateTests.uid, ReleaseGateTests.uid + 1, ReleaseGateTests.uid + 2)

    static func verify(_ h: Harness, uid: UInt32) -> Response {
        Session(fd: -1, caller: ReleaseGateTests.caller().sentBy(uid: uid), broker: h.broker).auditVerify(Request(.auditVerify))
    }

    /// The outcomes of `uid`'s `audit verify` entries, oldest first.
    static func verifyOutcomes(_ h: Harness, uid: UInt32) -> [String] {
        h.broker.withStore { (try? $0.auditEntries(visibleTo: uid)) ?? [] }.filter { $0.readable.operation == "audit-verify" }.map(\.readable.outcome)
    }

    /// Another thread holds the shared long-read reader (as another user's list page or search
    /// page does) until the verify answered, or 30 s: the verify is answered meanwhile, and
    /// intact. A verify on the shared reader waits for it, and this fails.
    @Test func aVerifyIsAnsweredWhileTheSharedLongReaderIsHeld() throws {
        let h = try Harness()
        _ = try #require(h.add("s1"))
        #expect(h.broker.longReader.withReader { _ in true } != nil)  // there is a shared long reader
        let (response, answeredWhileHeld) = ReaderLookupTests.whileAnotherThreadHolds({ inside in
            _ = h.broker.longReader.withReader { _ in inside() }
        }) { Self.verify(h, uid: 0) }
        #expect(answeredWhileHeld)
        #expect(response.outcome == .ok)
        #expect(response.count == 1)  // the put; the verify's own entry follows its check
    }

    /// Another thread is inside a verify (its reader open) until a list page of another user
    /// was read on the shared long-read reader, or 30 s: the page is read meanwhile. A verify on
    /// the shared reader holds it, and this fails.
    @Test func aListPageIsReadWhileAnotherUsersVerifyIsInFlight() throws {
        let h = try Harness()
        let item = try #require(h.add("s1"))
        let verified = Mutex<AuditVerification?>(nil)
        let (page, answeredWhileHeld) = ReaderLookupTests.whileAnotherThreadHolds({ inside in
            let r = h.broker.verifyRead(uid: Self.other) { (source) throws(StoreError) in
                inside()
                return try source.verifyAudit(visibleTo: nil).verification
            }
            verified.withLock { $0 = try? r.get() }
        }) {
            h.broker.longRead { (source) throws(StoreError) in try source.items(owner: Self.mine, after: nil, limit: 500).items.map(\.id) }
        }
        #expect(answeredWhileHeld)
        #expect((try? page.get()) == [item.id])
        #expect(verified.withLock { $0 } == .intact(count: 1))
    }

    /// Runs `body` while another thread is inside a verify of `uid` (its reader open), until
    /// `body` answered or 30 s; see `ReaderLookupTests.whileAnotherThreadHolds`. On threads,
    /// not nested on one: a verify that took the shared long reader would wait, not deadlock.
    static func whileVerifying<R>(_ h: Harness, uid: UInt32, _ body: () -> R) -> (R, answeredWhileHeld: Bool) {
        ReaderLookupTests.whileAnotherThreadHolds({ inside in
            _ = h.broker.verifyRead(uid: uid) { (_) throws(StoreError) in inside() }
        }, body)
    }

    /// While a verify of one uid is in flight, a second verify of that uid is *busy* (15) and
    /// audited as such; another uid's verify is served. Once the first ends, the same uid's
    /// verify is served again.
    @Test func aSecondVerifyOfTheSameUserIsBusyAndAuditedAnotherUsersIsServed() throws {
        let h = try Harness()
        _ = try #require(h.add("s1"))
        let (inside, answeredWhileHeld) = Self.whileVerifying(h, uid: Self.mine) {
            (same: Self.verify(h, uid: Self.mine), another: Self.verify(h, uid: Self.other))
        }
        #expect(answeredWhileHeld)
        #expect(inside.same.outcome == .busy)
        #expect(inside.another.outcome == .ok)
        #expect(Self.verify(h, uid: Self.mine).outcome == .ok)
        #expect(Self.verifyOutcomes(h, uid: Self.mine) == ["busy", "ok"])
        #expect(Self.verifyOutcomes(h, uid: Self.other) == ["ok"])
    }

    /// With two non-root uids' verifies in flight, a third uid's is *busy* and audited; root's
    /// is served (it has a slot of its own); once one ends, the third uid's is served.
    @Test func beyondTwoVerifiesAtATimeAUsersIsBusyAndRootsIsServed() throws {
        let h = try Harness()
        _ = try #require(h.add("s1"))
        let ((inside, innerHeld), outerHeld) = Self.whileVerifying(h, uid: Self.mine) {
            Self.whileVerifying(h, uid: Self.other) { (third: Self.verify(h, uid: Self.third), root: Self.verify(h, uid: 0)) }
        }
        #expect(outerHeld && innerHeld)
        #expect(inside.third.outcome == .busy)
        #expect(inside.root.outcome == .ok)
        #expect(Self.verify(h, uid: Self.third).outcome == .ok)
        #expect(Self.verifyOutcomes(h, uid: Self.third) == ["busy", "ok"])
    }

    /// Closing the vault while a verify's reader is open waits for that verify (the writer's
    /// close must be the last, which checkpoints and removes the WAL), and no verify opens a
    /// reader after: it is answered as the closed store answers. A close that did not wait
    /// returns while the verify holds its reader, and leaves the WAL behind.
    @Test func closingTheVaultWaitsForAVerifyInFlightAndNoneStartsAfter() throws {
        let h = try Harness()
        _ = try #require(h.add("s1"))
        let closed = DispatchSemaphore(value: 0)
        let (closedWhileVerifying, answeredWhileHeld) = Self.whileVerifying(h, uid: Self.other) {
            Thread { h.broker.close(); closed.signal() }.start()
            return closed.wait(timeout: .now() + 0.5) == .success
        }
        #expect(answeredWhileHeld)
        #expect(!closedWhileVerifying, "the vault closed while a verify's reader was open")
        if !closedWhileVerifying {
            #expect(closed.wait(timeout: .now() + 30) == .success, "the close did not finish once the verify ended")
        }
        #expect(!FileManager.default.fileExists(atPath: h.dbPath + "-wal"), "the writer's close was not the last")
        let after = h.broker.verifyRead(uid: Self.other) { (source) throws(StoreError) in try source.verifyAudit(visibleTo: nil).verification }
        guard case .failure(let refused) = after else { Issue.record("a verify after the close was served"); return }
        #expect(refused.outcome == StoreError.closed.outcome)
    }
}
