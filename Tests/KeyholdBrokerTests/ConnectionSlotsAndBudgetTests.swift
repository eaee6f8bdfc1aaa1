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
