// The commit rules. Each is held by the test named after it.
//
//  1. A secret MUST be opened only in `Session.release`, under the writer, in the transaction
//     that appends its audit entry. (RequestTableTests.onlyTheReleasingRowsHandOutASecretAndOnlyAfterTheirEntryIsCommitted)
//  2. Nothing MUST be answered before the commit holding its entry is durable; a failed commit
//     releases nothing to any member of its group. (GroupCommitTests.aFailedCommitReleasesNothingToAnyMember)
//  3. An acknowledged write MUST survive kill -9. (GroupCommitThroughBrokerTests.killNineDuringABurstLosesNoAcknowledgedWrite)
//  4. A member whose own part fails MUST be rolled back alone; the others land.
//     (GroupCommitTests.aMemberThatFailsRollsBackAloneAndOthersLand)
//  5. An entry that cannot be written MUST refuse the request (*audit unavailable*).
//     (AuditTests.failsClosedWhenTheAuditCannotBeWritten)
//  6. Every member MUST return, whatever the interleaving. (GroupCommitTests.handOffsUnderChurnStrandNoMember)

import Glibc
import KeyholdVault

/// Audit group commit: a plain leader and followers on one mutex and one condition variable.
/// Each caller queues its store work (an audit entry, and the change or release it belongs to)
/// with `run`; whichever caller finds no commit in progress becomes the leader, takes every
/// member queued so far, runs each one's work as a nested transaction inside one outer
/// transaction, commits once (one fsync for the whole group) and wakes the others. Callers that
/// arrive during a commit share the next one. A member learns its outcome only after the commit
/// that holds its entry: if that commit fails, every member of the group gets false and
/// releases nothing.
///
/// Members' work must be short and never block (no PAM, no socket I/O): it runs under the
/// store lock, on the leader's thread.
final class GroupCommit: @unchecked Sendable {
    /// One caller's queued work; its fields are guarded by `mutex`.
    private final class Member {
        /// Let go by the leader once run: the caller's closure must not outlive its call
        /// (`withoutActuallyEscaping`).
        var work: ((VaultStore) -> Bool)?
        var finished = false
        var committed = false
        init(_ work: @escaping (VaultStore) -> Bool) { self.work = work }
    }

    private let mutex: UnsafeMutablePointer<pthread_mutex_t>
    private let finished: UnsafeMutablePointer<pthread_cond_t>
    private var queue: [Member] = []
    private var leading = false
    /// Members per commit, for the benchmark's and the tests' view of batching.
    private(set) var commits = 0
    private(set) var membersCommitted = 0

    /// Members waiting for the next commit (tests use it to build a group of known size).
    var waiting: Int {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return queue.count
    }

    init() {
        mutex = .allocate(capacity: 1)
        finished = .allocate(capacity: 1)
        pthread_mutex_init(mutex, nil)
        pthread_cond_init(finished, nil)
    }

    deinit {
        pthread_cond_destroy(finished)
        pthread_mutex_destroy(mutex)
        finished.deallocate()
        mutex.deallocate()
    }

    /// Runs `work` in the next group and returns whether the commit holding it succeeded.
    /// `work` returns false when its own part failed (its writes are then rolled back alone).
    /// `withStore` gives the leader the store under its lock.
    func run(_ work: (VaultStore) -> Bool, withStore: ((VaultStore) -> Void) -> Void) -> Bool {
        // The caller waits until its member is finished, so the closure never outlives this call.
        withoutActuallyEscaping(work) { work in
            let member = Member(work)
            pthread_mutex_lock(mutex)
            defer { pthread_mutex_unlock(mutex) }
            queue.append(member)
            while !member.finished {
                if leading {
                    pthread_cond_wait(finished, mutex)
                } else {
                    lead(withStore)
                }
            }
            return member.committed
        }
    }

    /// Called with the mutex held; returns with it held. Commits everything queued so far,
    /// then wakes every waiting member (the finished ones return, one of the rest leads next).
    private func lead(_ withStore: ((VaultStore) -> Void) -> Void) {
        leading = true
        let group = queue
        queue.removeAll()
        pthread_mutex_unlock(mutex)

        var results = [Bool](repeating: false, count: group.count)
        var committed = false
        withStore { store in
            committed = store.groupTransaction {
                for (i, member) in group.enumerated() { results[i] = member.work?(store) ?? false }
            }
        }

        pthread_mutex_lock(mutex)
        for (i, member) in group.enumerated() {
            member.work = nil
            member.committed = committed && results[i]
            member.finished = true
        }
        commits += 1
        membersCommitted += group.count
        leading = false
        pthread_cond_broadcast(finished)
    }
}
