import Foundation
import Synchronization
import Testing
import KeyholdCore
import KeyholdVault
import KeyholdTestSupport
@testable import KeyholdBroker

/// Group commit against a real SQLite vault: members answered only after the commit that holds
/// their entry, and a commit that fails releases nothing to any member of its group.
@Suite struct GroupCommitTests {
    final class Harness: @unchecked Sendable {
        let directory = TestPaths.temporaryDirectory("kh-group")
        let store: Mutex<VaultStore>
        let group = GroupCommit()
        init() throws {
            store = Mutex(try VaultStore.open(stateDirectory: directory + "/state", passwordHashing: .interactive))
        }
        deinit { try? FileManager.default.removeItem(atPath: directory) }

        func run(_ work: (VaultStore) -> Bool) -> Bool {
            group.run(work, withStore: { body in store.withLock { body($0) } })
        }
        /// Raw SQL beside the store, for faults and for reading back what is on disk.
        func sql(_ text: String) throws {
            let db = try Database(path: directory + "/state/vault.db")
            try db.execute(text)
            db.close()
        }
        /// A fault at COMMIT for any group holding an entry of pid 666: a deferred foreign key
        /// that only the commit checks.
        func installCommitFault() throws {
            try sql("""
                CREATE TABLE fault_parent (id INTEGER PRIMARY KEY);
                CREATE TABLE fault_child (p INTEGER REFERENCES fault_parent(id) DEFERRABLE INITIALLY DEFERRED);
                CREATE TRIGGER commit_fault AFTER INSERT ON audit WHEN NEW.caller_pid = 666
                BEGIN INSERT INTO fault_child VALUES (1); END;
                """)
        }
        /// A first member, on a thread of its own, that leads and holds its group open (its entry
        /// "first" not yet written) until `proceed`; `finished` waits for it and says whether it
        /// was acknowledged. Lets a test queue members of known number behind a running commit.
        func holdLeader() -> (proceed: () -> Void, finished: () -> Bool) {
            let inside = DispatchSemaphore(value: 0), proceed = DispatchSemaphore(value: 0), done = DispatchSemaphore(value: 0)
            let ok = Mutex(false)
            Thread.detachNewThread {
                let acknowledged = self.run { store in
                    inside.signal()
                    proceed.wait()
                    return (try? store.append(GroupCommitTests.record("first"))) != nil
                }
                ok.withLock { $0 = acknowledged }
                done.signal()
            }
            inside.wait()
            return ({ proceed.signal() }, { done.wait(); return ok.withLock { $0 } })
        }
        /// After a group failed at COMMIT behind `holdLeader`'s member: only that member's entry
        /// ("first") is stored, and once the fault is dropped the next group of 8 commits and the
        /// chain verifies (9 entries).
        func expectOnlyTheHeldEntryThenRecovery(sourceLocation: SourceLocation = #_sourceLocation) throws {
            let onDisk = try store.withLock { s in try s.auditEntries(visibleTo: nil).compactMap(\.readable.reason) }
            #expect(onDisk == ["first"], sourceLocation: sourceLocation)
            try sql("DROP TRIGGER commit_fault")
            #expect(GroupCommitTests.burst(self, members: 8, marker: "after").allSatisfy { $0 }, sourceLocation: sourceLocation)
            #expect(try store.withLock { try $0.verifyAudit() } == .intact(count: 9), sourceLocation: sourceLocation)
        }
        func entries(reason marker: String) throws -> Int {
            try store.withLock { s in try s.auditEntries(visibleTo: nil).filter { $0.readable.reason?.hasPrefix(marker) == true }.count }
        }
    }

    static func record(_ reason: String, pid: Int32 = 4242) -> AuditRecord {
        AuditRecord(callerUID: 1000, callerPID: pid, executable: "/usr/bin/kh-test-client", operation: .get,
                    service: "s", account: "a", decision: .granted, method: .none, reason: reason, outcome: .ok)
    }

    /// Runs `members` threads at once, each appending one entry; returns whether each was acknowledged.
    static func burst(_ h: Harness, members: Int, marker: String) -> [Bool] {
        let acknowledged = Mutex([Bool](repeating: false, count: members))
        runThreads(members) { i in
            let ok = h.run { store in (try? store.append(record("\(marker)-\(i)"))) != nil }
            acknowledged.withLock { $0[i] = ok }
        }
        return acknowledged.withLock { $0 }
    }

    @Test func concurrentMembersShareCommitsAndAllLand() throws {
        let h = try Harness()
        let acks = Self.burst(h, members: 64, marker: "m")
        #expect(acks.allSatisfy { $0 })
        #expect(try h.entries(reason: "m-") == 64)
        #expect(h.group.membersCommitted == 64)
        #expect(h.group.commits <= 64)
        #expect(try h.store.withLock { try $0.verifyAudit() } == .intact(count: 64))
    }

    @Test func aMemberThatFailsRollsBackAloneAndOthersLand() throws {
        let h = try Harness()
        let acks = Mutex([Bool](repeating: false, count: 16))
        runThreads(16) { i in
            let ok = h.run { store in
                do {
                    try store.memberTransaction { () throws(StoreError) in
                        try store.append(Self.record("f-\(i)"))
                        if i % 4 == 0 { throw StoreError.integrity }  // this member's own failure
                    }
                    return true
                } catch { return false }
            }
            acks.withLock { $0[i] = ok }
        }
        let result = acks.withLock { $0 }
        for i in 0..<16 { #expect(result[i] == (i % 4 != 0)) }
        #expect(try h.entries(reason: "f-") == 12)
        #expect(try h.store.withLock { try $0.verifyAudit() } == .intact(count: 12))
    }

    /// Through the broker, as a release and a plain entry commit: a member whose append fails
    /// (a trigger refuses entries of pid 667) leaves nothing of it: every other member of the
    /// same groups lands, and the chain verifies.
    @Test func aMemberWhoseOnlyWriteIsItsAppendFailsAlone() throws {
        let h = try ReaderLookupTests.Harness()
        let db = try Database(path: h.dbPath)
        try db.execute("CREATE TRIGGER append_fault BEFORE INSERT ON audit WHEN NEW.caller_pid = 667 BEGIN SELECT RAISE(ABORT, 'fault'); END;")
        db.close()
        let outcomes = Mutex([Result<Int, StoreError>?](repeating: nil, count: 32))
        runThreads(32) { i in
            let record = Self.record("o-\(i)", pid: i % 4 == 0 ? 667 : 4242)
            let result = h.broker.transact(record) { (store) throws(StoreError) -> Int in
                _ = try store.item(owner: 1000, service: "s", account: "a")  // reads first, as a release's confirmation does
                try store.append(record)
                return i
            }
            outcomes.withLock { $0[i] = result }
        }
        let results = outcomes.withLock { $0 }
        for i in 0..<32 {
            switch results[i] {
            case .success(let v)?: #expect(i % 4 != 0 && v == i)
            case .failure(let e)?: #expect(i % 4 == 0 && e == .auditWriteFailed, "\(i): \(e)")
            case nil: Issue.record("\(i): no outcome")
            }
        }
        let stored: [String] = h.broker.withStore { store in (try? store.auditEntries(visibleTo: nil).compactMap(\.readable.reason)) ?? [] }
        let expected: [String] = (0..<32).filter { $0 % 4 != 0 }.map { "o-\($0)" }
        #expect(Set(stored.filter { $0.hasPrefix("o-") }) == Set(expected))
        let verified = h.broker.withStore { store in try? store.verifyAudit() }
        #expect(verified == .intact(count: Int64(stored.count)))
    }

    /// A fault at COMMIT time (a deferred foreign-key violation, which SQLite checks only
    /// when the outer transaction commits) in a group of 47: none of the 47 is acknowledged and
    /// none of their entries is stored; the member committed before it, and those after, land.
    @Test func aFailedCommitReleasesNothingToAnyMember() throws {
        let h = try Harness()
        try h.installCommitFault()
        // A first member holds the leader inside its work until 47 others are queued behind
        // it, so the next commit carries all 47, one of which trips the fault.
        let first = h.holdLeader()
        let acks = Mutex([Bool](repeating: true, count: 47))
        let all = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            runThreads(47) { i in
                let r = Self.record("c-\(i)", pid: i == 23 ? 666 : 4242)
                let ok = h.run { store in (try? store.append(r)) != nil }
                acks.withLock { $0[i] = ok }
            }
            all.signal()
        }
        let deadline = Date().addingTimeInterval(30)
        while h.group.waiting < 47 && Date() < deadline { usleep(5_000) }
        #expect(h.group.waiting == 47)
        first.proceed()
        let firstAcknowledged = first.finished()
        all.wait()
        #expect(firstAcknowledged)
        #expect(acks.withLock { $0 }.allSatisfy { !$0 }, "a member of the failed group was acknowledged")
        // Nothing of the failed group is stored; the group after it commits normally.
        try h.expectOnlyTheHeldEntryThenRecovery()
    }

    /// Under churn (16 threads, 150 rounds each, work of random length, some members
    /// failing their own part) every member returns, with its own outcome, and exactly the
    /// acknowledged entries are stored: a hand-off that lost a wake-up would leave a caller
    /// waiting (the run is bounded: the test fails after 60 s instead of hanging CI).
    @Test func handOffsUnderChurnStrandNoMember() throws {
        let h = try Harness()
        let threads = 16, rounds = 150
        let outcomes = Mutex([Bool?](repeating: nil, count: threads * rounds))
        let finished = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            runThreads(threads) { t in
                for r in 0..<rounds {
                    let i = t * rounds + r
                    let ok = h.run { store in
                        if i % 7 == 0 { usleep(UInt32.random(in: 0...300)) }
                        guard i % 11 != 0 else { return false }  // this member's own failure
                        return (try? store.append(Self.record("churn-\(i)"))) != nil
                    }
                    outcomes.withLock { $0[i] = ok }
                    if r % 13 == 0 { usleep(UInt32.random(in: 0...200)) }
                }
            }
            finished.signal()
        }
        try #require(finished.wait(timeout: .now() + 60) == .success, "a member never returned")
        let seen = outcomes.withLock { $0 }
        for (i, ok) in seen.enumerated() { #expect(ok == (i % 11 != 0), "member \(i): \(String(describing: ok))") }
        let acknowledged = seen.filter { $0 == true }.count
        #expect(try h.entries(reason: "churn-") == acknowledged)
        #expect(try h.store.withLock { try $0.verifyAudit() } == .intact(count: Int64(acknowledged)))
        #expect(h.group.membersCommitted == threads * rounds)
    }
}
