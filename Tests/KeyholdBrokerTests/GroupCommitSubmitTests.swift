import Foundation
import Synchronization
import Testing
import KeyholdCore
import KeyholdVault
import KeyholdTestSupport
@testable import KeyholdBroker

/// Members queued with `GroupCommit.submit` (the event loop's `get`s) do not wait for their
/// commit: each completion runs once, after the commit that holds its entry, with that
/// commit's outcome; a commit that fails releases nothing to any of them.
@Suite struct GroupCommitSubmitTests {
    typealias Harness = GroupCommitTests.Harness

    /// Rows of `pid` committed, read on a connection of its own (only what is committed).
    static func committed(_ h: Harness, pid: Int32) throws -> Int {
        let db = try Database(path: h.directory + "/state/vault.db", readOnly: true)
        defer { db.close() }
        return try db.withStatement("SELECT count(*) FROM audit WHERE caller_pid = ?1") { (s) throws(DatabaseError) -> Int in
            try s.bind(1, Int64(pid))
            return try s.step() ? Int(s.int64(0)) : -1
        }
    }

    func submit(_ h: Harness, _ work: @escaping (VaultStore) -> Bool, then: @escaping (Bool) -> Void) {
        h.group.submit(work, withStore: { body in h.store.withLock { body($0) } }, completion: then)
    }

    /// Stands in for the broker's event loop: told through `handLeadTo`, a thread of its own
    /// runs the answers a leader left and leads what is queued, as a woken worker does.
    final class EventLoopStandIn: @unchecked Sendable {
        let told = DispatchSemaphore(value: 0)
        private let stopped = Atomic<Bool>(false), done = DispatchSemaphore(value: 0)
        init(_ h: Harness) {
            h.group.handLeadTo { [told] in told.signal() }
            Thread.detachNewThread { [self] in
                while !stopped.load(ordering: .relaxed) {
                    guard told.wait(timeout: .now() + 0.05) == .success else { continue }
                    h.group.runLeftCompletions()
                    h.group.leadIfQueued(withStore: { body in h.store.withLock { body($0) } })
                }
                done.signal()
            }
        }
        func stop() { stopped.store(true, ordering: .relaxed); done.wait() }
    }

    /// 8 threads submit and 8 wait (`run`), 60 members each, some failing their own part:
    /// every completion runs exactly once, with its member's outcome, and finds its entry
    /// committed (or absent) on another connection; exactly the acknowledged entries are
    /// stored and the chain is intact. With an event loop to leave answers to, and without.
    /// Bounded at 60 s.
    @Test(arguments: [false, true]) func submittedMembersAreAnsweredOnceAfterTheirCommit(withEventLoop: Bool) throws {
        let h = try Harness()
        let loop = withEventLoop ? EventLoopStandIn(h) : nil
        defer { loop?.stop() }
        let threads = 16, rounds = 60, total = threads * rounds
        let calls = Mutex([Int](repeating: 0, count: total))
        let outcomes = Mutex([Bool?](repeating: nil, count: total))
        let onDisk = Mutex([Int](repeating: -1, count: total))
        let left = Atomic<Int>(total)
        let finished = DispatchSemaphore(value: 0)
        @Sendable func settle(_ i: Int, _ ok: Bool, seen: Int) {
            calls.withLock { $0[i] += 1 }
            outcomes.withLock { $0[i] = ok }
            onDisk.withLock { $0[i] = seen }
            if left.subtract(1, ordering: .sequentiallyConsistent).newValue == 0 { finished.signal() }
        }
        Thread.detachNewThread {
            runThreads(threads) { t in
                for r in 0..<rounds {
                    let i = t * rounds + r
                    let pid = Int32(100_000 + i)
                    let work: (VaultStore) -> Bool = { store in
                        guard i % 9 != 0 else { return false }  // this member's own failure
                        return (try? store.append(GroupCommitTests.record("submit-\(i)", pid: pid))) != nil
                    }
                    if t % 2 == 0 {
                        submit(h, work) { ok in settle(i, ok, seen: (try? Self.committed(h, pid: pid)) ?? -1) }
                    } else {
                        let ok = h.run(work)
                        settle(i, ok, seen: (try? Self.committed(h, pid: pid)) ?? -1)
                    }
                    if r % 11 == 0 { usleep(UInt32.random(in: 0...300)) }
                }
            }
        }
        try #require(finished.wait(timeout: .now() + 60) == .success, "a member was never answered")
        usleep(100_000)  // a second, wrong completion would land here
        #expect(calls.withLock { $0 }.allSatisfy { $0 == 1 })
        let seen = outcomes.withLock { $0 }, disk = onDisk.withLock { $0 }
        for i in 0..<total {
            #expect(seen[i] == (i % 9 != 0), "member \(i): \(String(describing: seen[i]))")
            #expect(disk[i] == (i % 9 != 0 ? 1 : 0), "member \(i) answered with \(disk[i]) rows committed")
        }
        let acknowledged = seen.filter { $0 == true }.count
        #expect(try h.entries(reason: "submit-") == acknowledged)
        #expect(try h.store.withLock { try $0.verifyAudit() } == .intact(count: Int64(acknowledged)))
    }

    /// A leader holds 47 submitted members queued behind its own group; one of them trips a
    /// fault at COMMIT: every one of the 47 completions gets false, none of their entries is
    /// stored, and the next group commits normally.
    @Test func aFailedCommitReleasesNothingToSubmittedMembers() throws {
        let h = try Harness()
        try h.installCommitFault()
        let first = h.holdLeader()
        let answers = Mutex([Bool?](repeating: nil, count: 47))
        let answered = DispatchSemaphore(value: 0)
        for i in 0..<47 {
            let r = GroupCommitTests.record("c-\(i)", pid: i == 23 ? 666 : 4242)
            // Returns at once: the leader is busy with its own group.
            submit(h, { store in (try? store.append(r)) != nil }) { ok in
                answers.withLock { $0[i] = ok }
                answered.signal()
            }
        }
        #expect(h.group.waiting == 47)
        first.proceed()
        _ = first.finished()
        for _ in 0..<47 { try #require(answered.wait(timeout: .now() + 30) == .success) }
        #expect(answers.withLock { $0 }.allSatisfy { $0 == false }, "a member of the failed group was acknowledged")
        try h.expectOnlyTheHeldEntryThenRecovery()
    }

    /// With a place to hand the lead to (the broker's event loop), a leader whose group had no
    /// submitted member and that leaves only submitted members queued asks there, and whoever
    /// answers (`leadIfQueued`) commits them.
    @Test func theLeadIsHandedOnWhenOnlySubmittedMembersAreQueued() throws {
        let h = try Harness()
        let asked = DispatchSemaphore(value: 0)
        h.group.handLeadTo { asked.signal() }
        let first = h.holdLeader()
        let answered = DispatchSemaphore(value: 0)
        let ok = Mutex(false)
        submit(h, { store in (try? store.append(GroupCommitTests.record("queued"))) != nil }) { committed in
            ok.withLock { $0 = committed }
            answered.signal()
        }
        first.proceed()
        _ = first.finished()
        try #require(asked.wait(timeout: .now() + 30) == .success, "the lead was not handed on")
        #expect(answered.wait(timeout: .now() + 0.2) == .timedOut, "committed before anyone took the lead")
        h.group.leadIfQueued(withStore: { body in h.store.withLock { body($0) } })
        try #require(answered.wait(timeout: .now() + 30) == .success)
        #expect(ok.withLock { $0 })
        #expect(try h.entries(reason: "queued") == 1)
    }

    final class Answers: Sendable {
        private let list = Mutex([Bool]())
        func append(_ ok: Bool) { list.withLock { $0.append(ok) } }
        var all: [Bool] { list.withLock { $0 } }
    }

    /// A submitted first member that leads its own group (on a thread of its own) and holds it
    /// open until `proceed`; its answers are collected in `answers`.
    static func holdSubmittingLeader(_ h: Harness, pid: Int32 = 4242) -> (proceed: () -> Void, answers: Answers) {
        let inside = DispatchSemaphore(value: 0), proceed = DispatchSemaphore(value: 0)
        let answers = Answers()
        Thread.detachNewThread {
            h.group.submit({ store in
                inside.signal()
                proceed.wait()
                return (try? store.append(GroupCommitTests.record("first", pid: pid))) != nil
            }, withStore: { body in h.store.withLock { body($0) } }, completion: { ok in answers.append(ok) })
        }
        inside.wait()
        return ({ proceed.signal() }, answers)
    }

    /// With somewhere to leave answers (the event loop), a leader whose group had submitted
    /// members and that finds more of them queued commits those at once, itself: the queued
    /// member is committed and answered though no one took the lead, while the first group's
    /// answer waits, unrun, until `runLeftCompletions` runs it, once, with its commit's outcome.
    @Test func aLeaderGoesStraightOnToQueuedMembersAndLeavesItsAnswers() throws {
        let h = try Harness()
        let told = DispatchSemaphore(value: 0)
        h.group.handLeadTo { told.signal() }
        let first = Self.holdSubmittingLeader(h)
        let secondAnswered = DispatchSemaphore(value: 0), secondOK = Mutex(false)
        submit(h, { store in (try? store.append(GroupCommitTests.record("second"))) != nil }) { ok in
            secondOK.withLock { $0 = ok }
            secondAnswered.signal()
        }
        #expect(h.group.waiting == 1)
        first.proceed()
        try #require(secondAnswered.wait(timeout: .now() + 30) == .success, "the queued member was left uncommitted")
        #expect(secondOK.withLock { $0 })
        try #require(told.wait(timeout: .now() + 30) == .success, "the event loop was not told of the answers left")
        #expect(first.answers.all.isEmpty, "the leader ran the answer it left")
        #expect(try h.entries(reason: "first") == 1 && h.entries(reason: "second") == 1)
        h.group.runLeftCompletions()
        h.group.runLeftCompletions()
        #expect(first.answers.all == [true], "the left answer ran other than once")
    }

    /// The same with a fault at the first group's COMMIT: the answer left for it says false,
    /// nothing of that group is stored, and the next group (committed by the same leader at
    /// once) stands alone in an intact chain.
    @Test func answersLeftForAFailedCommitReleaseNothing() throws {
        let h = try Harness()
        try h.installCommitFault()
        let told = DispatchSemaphore(value: 0)
        h.group.handLeadTo { told.signal() }
        let first = Self.holdSubmittingLeader(h, pid: 666)
        let secondAnswered = DispatchSemaphore(value: 0), secondOK = Mutex(false)
        submit(h, { store in (try? store.append(GroupCommitTests.record("second"))) != nil }) { ok in
            secondOK.withLock { $0 = ok }
            secondAnswered.signal()
        }
        first.proceed()
        try #require(secondAnswered.wait(timeout: .now() + 30) == .success)
        try #require(told.wait(timeout: .now() + 30) == .success)
        h.group.runLeftCompletions()
        #expect(first.answers.all == [false], "a member of the failed group was acknowledged")
        #expect(secondOK.withLock { $0 })
        #expect(try h.entries(reason: "first") == 0 && h.entries(reason: "second") == 1)
        #expect(try h.store.withLock { try $0.verifyAudit() } == .intact(count: 1))
    }
}
