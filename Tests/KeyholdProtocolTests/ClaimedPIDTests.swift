import Testing
import KeyholdCore
import KeyholdClient
@testable import KeyholdProtocol

/// The Secret Service agent's claimed requester pid: carried exactly, refused when not a pid.
@Suite struct ClaimedPIDTests {
    @Test func roundTripsAndRejectsOutOfRange() throws {
        var r = Request(.get, item: ItemReference(service: "s", account: "a"))
        r.claimedPID = 4242
        guard case .request(let back) = try ClientMessage.decode(ClientMessage.request(r).encode()) else {
            Issue.record("not a request"); return
        }
        #expect(back.claimedPID == 4242)
        var none = r
        none.claimedPID = nil
        guard case .request(let plain) = try ClientMessage.decode(ClientMessage.request(none).encode()) else { return }
        #expect(plain.claimedPID == nil)
        for bad: Int32 in [0, -1, Int32.min] {
            var b = r
            b.claimedPID = bad
            #expect(throws: FrameError.self) { _ = try ClientMessage.decode(ClientMessage.request(b).encode()) }
        }
    }
}
