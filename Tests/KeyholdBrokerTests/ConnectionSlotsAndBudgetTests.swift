import Glibc
import Testing
import KeyholdCore
@testable import KeyholdBroker

/// Issue 8, items 1–2: the accounting behind *busy*, exactly at its limits.
struct ConnectionSlotsAndBudgetTests {
    @Test func oneUidCannotTakeOthersOrRootsSlots() {
        let slots = ConnectionSlots()
        let l = slots.limits
        #expect((0..<l.perUID).allSatisfy { _ in slots.acquire(uid: 1000) })
        #expect(!slots.acquire(uid: 1000), "the per-uid cap")
        // Fill the shared pool with other uids at their caps…
        var uid: UInt32 = 2000
        var shared = l.perUID
        while shared + l.perUID <= l.sharedPool {
            for _ in 0..<l.perUID { #expect(slots.acquire(uid: uid)) }
            shared += l.perUID
            uid += 1
        }
        while shared < l.sharedPool { #expect(slots.acquire(uid: uid)); shared += 1 }
        // …a newcomer still gets its first few, then busy; root keeps its whole reserve.
        #expect((0..<l.alwaysAdmitted).allSatisfy { _ in slots.acquire(uid: 9999) })
        #expect(!slots.acquire(uid: 9999))
        #expect((0..<l.rootReserve).allSatisfy { _ in slots.acquire(uid: 0) })
        #expect(!slots.acquire(uid: 0))
        // The newcomer's slots counted toward the pool too: once they and one of 1000's are
        // released, 1000 gets its slot back.
        for _ in 0..<l.alwaysAdmitted { slots.release(uid: 9999) }
        #expect(!slots.acquire(uid: 1000))
        slots.release(uid: 1000)
        #expect(slots.acquire(uid: 1000))
    }

    @Test func makingRoomEndsTheLongestWaitingKeptConnectionOfThatUidOnly() {
        // Three kept connections (socket pairs: [broker side, client side]), two of uid 1000.
        var pairs: [[Int32]] = []
        for _ in 0..<3 {
            var sv: [Int32] = [-1, -1]
            #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &sv) == 0)
            pairs.append(sv)
        }
        defer { for p in pairs { close(p[0]); close(p[1]) } }
        let slots = ConnectionSlots()
        let older = slots.keep(fd: pairs[0][0], uid: 1000), newer = slots.keep(fd: pairs[1][0], uid: 1000)
        let otherUID = slots.keep(fd: pairs[2][0], uid: 2000)
        let olderSince = older.startWaiting()
        usleep(2_000)
        let newerSince = newer.startWaiting()
        _ = otherUID.startWaiting()
        #expect(!slots.makeRoom(uid: 3000), "a uid with no kept connection waiting")
        #expect(slots.makeRoom(uid: 1000))
        // The oldest was ended: its client can no longer send, its broker side reads the end.
        var byte: UInt8 = 1
        #expect(send(pairs[0][1], &byte, 1, Int32(MSG_NOSIGNAL)) == -1 && errno == EPIPE)
        #expect(recv(pairs[0][0], &byte, 1, Int32(MSG_DONTWAIT)) == 0)
        #expect(send(pairs[1][1], &byte, 1, Int32(MSG_NOSIGNAL)) == 1, "the newer one is left alone")
        #expect(older.stopWaiting(olderSince))
        #expect(!newer.stopWaiting(newerSince))
        // Once a connection stops waiting (a request came), it is not ended for anyone; nor
        // is one that was forgotten (its session is closing it).
        #expect(!slots.makeRoom(uid: 1000))
        #expect(send(pairs[1][1], &byte, 1, Int32(MSG_NOSIGNAL)) == 1)
        slots.forget(otherUID)
        #expect(!slots.makeRoom(uid: 2000))
        #expect(send(pairs[2][1], &byte, 1, Int32(MSG_NOSIGNAL)) == 1)
    }

    @Test func overBudgetRequestsAreCountedIntoOneBurst() {
        let budget = AuditBudget()
        #expect(budget.admit(uid: 1000))
        budget.charge(uid: 1000, bytes: AuditBudget.burstBytes + 100_000)  // ~24 s of refill in debt
        for _ in 0..<5 { #expect(!budget.admit(uid: 1000)) }
        budget.suppress(uid: 1000)
        // In debt and its first burst not yet written: written now, with every refusal counted.
        let bursts = budget.takeBursts()
        #expect(bursts.count == 1 && bursts[0].uid == 1000 && bursts[0].count == 6)
        // Within the interval and still in debt: nothing more until it refills or 10 s pass.
        #expect(!budget.admit(uid: 1000))
        #expect(budget.takeBursts().isEmpty)
        #expect(budget.takeBursts(all: true).map(\.count) == [1])
        // Root is never refused by the budget; other uids have their own.
        budget.charge(uid: 0, bytes: 10 * AuditBudget.burstBytes)
        #expect(budget.admit(uid: 0))
        #expect(budget.admit(uid: 1001))
    }
}
