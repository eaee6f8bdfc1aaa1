import Glibc
import CKeyholdOS
import KeyholdVault

/// Audit group commit. Each caller hands its store work (an audit entry, and the change or
/// release it belongs to) to `run`; whichever caller finds no commit in progress becomes the
/// leader, runs every queued member's work as a nested transaction inside one outer
/// transaction, commits once (one fsync for the whole group) and wakes the members. A member
/// learns its outcome only after the commit that holds its entry: if that commit fails, every
/// member of the group gets `.auditWriteFailed` and releases nothing.
///
/// Members' work must be short and never block (no PAM, no socket I/O): it runs under the
/// store lock, on the leader's thread.
///
/// A member queued with `submit` does not wait: its completion runs with its outcome, after the
/// commit, on the thread that led its group, or on a thread that `handLeadTo` names when that
/// leader went straight on to the next group (the broker's event loop answers a `get` that way,
/// EventLoop.swift). A completion must not block either: later groups' members may wait for
/// the thread that runs it.
final class GroupCommit: @unchecked Sendable {
    /// One caller's queued work. `work` and `committed` are guarded by `GroupCommit.mutex`
    /// until `word` says finished; then they are the caller's alone.
    private final class Member {
        /// Let go by the leader once run: the caller's closure must not outlive its call
        /// (`withoutActuallyEscaping`), and a finished member may return before `lead` does.
        var work: ((VaultStore) -> Bool)?
        var committed = false
        /// `submit`'s: run with the outcome once finished; nil for `run`'s, which wait on `word`.
        var completion: ((Bool) -> Void)?
        /// What the caller waits for, set under the mutex and read without it: waiting, told
        /// to lead, or finished. A word of its own, so that a woken member does not take the
        /// group's mutex back (a herd the next leader had to wait through: measured as most of
        /// the broker's futex calls, half of them contended unlocks).
        let word: UnsafeMutablePointer<UInt32>
        init(_ work: @escaping (VaultStore) -> Bool) {
            self.work = work
            word = .allocate(capacity: 1)
            word.initialize(to: State.waiting)
        }
        deinit { word.deallocate() }
        var isFinished: Bool { ckh_word_load(word) == State.finished }
    }

    private enum State {
        static let waiting: UInt32 = 0, lead: UInt32 = 1, finished: UInt32 = 2
    }

    private typealias Completion = (run: (Bool) -> Void, committed: Bool)

    private let mutex: UnsafeMutablePointer<pthread_mutex_t>
    private var queue: [Member] = []
    /// Finished groups' completions a leader left for `handLeadTo`'s thread (`runLeftCompletions`).
    private var leftCompletions: [[Completion]] = []
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
        pthread_mutex_init(mutex, nil)
    }

    deinit {
        pthread_mutex_destroy(mutex)
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
            queue.append(member)
            if !leading { lead(withStore) }
            pthread_mutex_unlock(mutex)
            while !member.isFinished {
                // Told to lead: unless a newcomer took the lead first (its commit then finishes
                // this member, or it hands on to it again).
                if ckh_word_swap_if(member.word, State.lead, State.waiting) != 0 {
                    pthread_mutex_lock(mutex)
                    if !leading && !member.isFinished { lead(withStore) }
                    pthread_mutex_unlock(mutex)
                    continue
                }
                ckh_word_wait(member.word, State.waiting)
            }
            return member.committed
        }
    }

    /// Called when only `submit`'s members are queued after a commit (none of them has a thread
    /// waiting to be told to lead): the broker's event loop, which lets a free worker call
    /// `runLeftCompletions` and `leadIfQueued`. A leader whose group had completions leads the
    /// queued members at once and leaves those completions to that worker, so the next commit
    /// does not wait for a thread to wake and take the lead (measured: at 64 clients a third of
    /// the writer's serial chain was such waiting; 64 clients 7–9% more gets/s); one whose
    /// group had none hands the lead on. Without it, the finishing leader runs its completions,
    /// then leads again itself.
    private var leadElsewhere: (@Sendable () -> Void)?

    func handLeadTo(_ elsewhere: @escaping @Sendable () -> Void) {
        pthread_mutex_lock(mutex)
        leadElsewhere = elsewhere
        pthread_mutex_unlock(mutex)
    }

    /// Queues `work` for the next group and returns at once, or after leading that group when
    /// no commit is in progress; `completion` gets whether the commit holding it succeeded (as
    /// `run` returns it).
    func submit(_ work: @escaping (VaultStore) -> Bool, withStore: @escaping ((VaultStore) -> Void) -> Void,
                completion: @escaping (Bool) -> Void) {
        let member = Member(work)
        member.completion = completion
        pthread_mutex_lock(mutex)
        queue.append(member)
        if !leading { lead(withStore) }
        pthread_mutex_unlock(mutex)
    }

    /// Runs the completions finished leaders left (see `leadElsewhere`), each once, in the
    /// order their groups committed.
    func runLeftCompletions() {
        pthread_mutex_lock(mutex)
        let left = leftCompletions
        leftCompletions.removeAll()
        pthread_mutex_unlock(mutex)
        for group in left {
            for c in group { c.run(c.committed) }
        }
    }

    /// Leads the queued members if no commit is in progress (a worker told by `leadElsewhere`);
    /// a member waiting in `run` is told to lead instead, as a finished leader would.
    func leadIfQueued(withStore: @escaping ((VaultStore) -> Void) -> Void) {
        pthread_mutex_lock(mutex)
        if !leading, !queue.isEmpty {
            if let waiter = queue.first(where: { $0.completion == nil }) {
                ckh_word_store(waiter.word, State.lead)
                pthread_mutex_unlock(mutex)
                ckh_word_wake(waiter.word)
                return
            }
            lead(withStore)
        }
        pthread_mutex_unlock(mutex)
    }

    /// Called with the mutex held; returns with it held. Takes everything queued so far, and
    /// again while only submitted members are queued and no one else is to lead them.
    private func lead(_ withStore: ((VaultStore) -> Void) -> Void) {
        while leadOnce(withStore), !leading, !queue.isEmpty {}
    }

    /// One group; true when this thread is to lead the next one itself.
    private func leadOnce(_ withStore: ((VaultStore) -> Void) -> Void) -> Bool {
        leading = true
        let group = queue
        queue.removeAll(keepingCapacity: true)
        pthread_mutex_unlock(mutex)

        var results = [Bool](repeating: false, count: group.count)
        var committed = false
        let raised = Self.raisePriority()
        defer { if let before = raised { _ = ckh_thread_nice_set(before) } }
        withStore { store in
            committed = store.groupTransaction {
                for (i, member) in group.enumerated() { results[i] = member.work?(store) ?? false }
            }
        }

        pthread_mutex_lock(mutex)
        // Words are set under the mutex, so a later "lead" never overwrites "finished".
        var completions: [Completion] = []
        var waiters: [Member] = []
        for (i, member) in group.enumerated() {
            member.work = nil
            member.committed = committed && results[i]
            if let completion = member.completion {
                completions.append((completion, member.committed))
                member.completion = nil
            } else {
                waiters.append(member)
            }
            ckh_word_store(member.word, State.finished)
        }
        commits += 1
        membersCommitted += group.count
        leading = false
        // The oldest waiter leads next (unless a newcomer takes the lead first). With only
        // submitted members queued, and somewhere to leave this group's completions, this
        // thread leads them at once; else it hands the lead to whoever `leadElsewhere` names,
        // or, without one, leads again itself after its completions.
        let next = queue.first(where: { $0.completion == nil })
        if let next { ckh_word_store(next.word, State.lead) }
        let onlySubmitted = next == nil && !queue.isEmpty
        let leaveCompletions = onlySubmitted && leadElsewhere != nil && !completions.isEmpty
        if leaveCompletions { leftCompletions.append(completions) }
        let elsewhere = onlySubmitted ? leadElsewhere : nil
        let again = onlySubmitted && (leaveCompletions || elsewhere == nil)
        // Woken after the mutex is let go; the members stay alive meanwhile (`group` and
        // `next` hold them), also once their callers have returned.
        pthread_mutex_unlock(mutex)
        if let next { ckh_word_wake(next.word) }
        elsewhere?()
        for member in waiters { ckh_word_wake(member.word) }
        // The lead is handed on (or kept) first, so the next group commits while these
        // answers go out.
        if !leaveCompletions {
            for c in completions { c.run(c.committed) }
        }
        pthread_mutex_lock(mutex)
        return again
    }

    /// How much the leader's thread is favoured while it leads: nice 10 lower weighs about nine
    /// times a session thread's share, so the leader, which every member of its group waits for,
    /// is rarely preempted by those members' sessions (measured with the benchmark: 64 clients
    /// about 10% more gets/s, lower p99).
    static let leaderNiceBoost: Int32 = 10

    /// Lowers this thread's nice value by `leaderNiceBoost` and returns the value to restore, or
    /// nil where the broker may not raise priority (without CAP_SYS_NICE): it then leads at the
    /// priority it has, which changes only speed.
    private static func raisePriority() -> Int32? {
        var before: Int32 = 0
        guard ckh_thread_nice_get(&before) == 0 else { return nil }
        guard ckh_thread_nice_set(max(before - leaderNiceBoost, -20)) == 0 else { return nil }
        return before
    }
}
