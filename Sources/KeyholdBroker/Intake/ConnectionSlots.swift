import Glibc
import Synchronization
import KeyholdCore

/// Connection slots, fair per uid, so that no local user can take every slot and deny service
/// to the others: non-root uids share one pool with a cap each, the first few connections of
/// any uid are always admitted, and root has a reserve of its own that no one else can use.
/// A uid beyond its share gets a *busy* answer, never a reset.
///
/// A kept connection waiting for its next request holds a slot too, so a uid at its cap gives
/// up its longest-waiting one (`makeRoom`): the newcomer's client retries its *busy* answer
/// into the freed slot, and the kept connection's client, finding it closed before its next
/// request was read, asks again on a new one (KeptConnection.swift).
final class ConnectionSlots: Sendable {
    struct Limits: Sendable {
        var sharedPool = 448
        var perUID = 32
        var alwaysAdmitted = 4
        var rootReserve = 256
    }

    let limits: Limits
    private struct State {
        var perUID: [UInt32: Int] = [:]
        var shared = 0
        /// Kept connections, by socket: added and removed by their session under this lock,
        /// removed before it closes the socket, so a descriptor found here is still that
        /// connection's.
        var kept: [Int32: KeptWait] = [:]
    }
    private let state = Mutex(State())

    init(_ limits: Limits = Limits()) { self.limits = limits }

    /// Takes a slot for `uid`; false when it is at its share (answer *busy*).
    func acquire(uid: UInt32) -> Bool {
        state.withLock { s in
            let mine = s.perUID[uid, default: 0]
            if uid == 0 {
                guard mine < limits.rootReserve else { return false }
            } else if mine >= limits.alwaysAdmitted {
                guard mine < limits.perUID, s.shared < limits.sharedPool else { return false }
            }
            s.perUID[uid] = mine + 1
            if uid != 0 { s.shared += 1 }
            return true
        }
    }

    /// Registers a session's connection `fd` of `uid` once it is kept (after its first
    /// request). Each wait for a next request is then marked on the returned `KeptWait`, without
    /// this lock; `forget` it before closing `fd`.
    func keep(fd: Int32, uid: UInt32) -> KeptWait {
        let k = KeptWait(fd: fd, uid: uid)
        state.withLock { $0.kept[fd] = k }
        return k
    }

    func forget(_ k: KeptWait) {
        state.withLock { s in if s.kept[k.fd] === k { s.kept[k.fd] = nil } }
    }

    /// For a newcomer of `uid` refused at its cap: ends `uid`'s kept connection that has waited
    /// longest for its next request. Its reading side is shut: the broker reads only what was
    /// already sent (a request that raced this is answered *busy*, not decided), and the
    /// client's next send fails, so it reconnects. False when none of `uid`'s is waiting.
    @discardableResult
    func makeRoom(uid: UInt32) -> Bool {
        state.withLock { s in
            let waiting = s.kept.values.filter { $0.uid == uid }.compactMap { k in k.waitingSince.map { (k, $0) } }
            for (k, since) in waiting.sorted(by: { $0.1 < $1.1 }) where k.end(ifWaitingSince: since) {
                // Under the lock: the session forgets `k` here before it closes `k.fd`.
                shutdown(k.fd, Int32(SHUT_RD))
                return true
            }
            return false
        }
    }

    func release(uid: UInt32) {
        state.withLock { s in
            let mine = s.perUID[uid, default: 0] - 1
            s.perUID[uid] = mine > 0 ? mine : nil
            if uid != 0 { s.shared -= 1 }
        }
    }
}

/// One kept connection's wait for its next request, marked by its session on every request
/// without a shared lock: an atomic word that is 0 while a request is served, the time the
/// wait began while it waits, and `ended` once `makeRoom` took it.
final class KeptWait: Sendable {
    let fd: Int32
    let uid: UInt32
    private let word = Atomic<UInt64>(0)
    private static let ended = UInt64.max

    init(fd: Int32, uid: UInt32) {
        self.fd = fd
        self.uid = uid
    }

    /// Marks the start of a wait; pass its value to `stopWaiting`.
    func startWaiting() -> UInt64 {
        let since = min(max(MonotonicClock.nanoseconds(), 1), Self.ended - 1)
        word.store(since, ordering: .sequentiallyConsistent)
        return since
    }

    /// The wait is over (a request, the end of the stream, or an error); true when it was
    /// ended to make room meanwhile.
    func stopWaiting(_ since: UInt64) -> Bool {
        !word.compareExchange(expected: since, desired: 0, ordering: .sequentiallyConsistent).exchanged
    }

    var waitingSince: UInt64? {
        let w = word.load(ordering: .sequentiallyConsistent)
        return w == 0 || w == Self.ended ? nil : w
    }

    /// Ends the wait that began at `since`, unless it is over already (one of this and
    /// `stopWaiting` wins).
    func end(ifWaitingSince since: UInt64) -> Bool {
        word.compareExchange(expected: since, desired: Self.ended, ordering: .sequentiallyConsistent).exchanged
    }
}
