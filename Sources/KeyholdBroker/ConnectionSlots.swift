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
        /// Kept connections waiting for their next request, by socket: registered and removed
        /// by their session under this lock, before it closes the socket, so a descriptor found
        /// here is still that connection's.
        var waiting: [Int32: Waiting] = [:]
    }
    private struct Waiting {
        let uid: UInt32
        let since: UInt64
        var ended = false
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

    /// A session's kept connection `fd` of `uid` now waits for its next request.
    func waitsForNextRequest(fd: Int32, uid: UInt32) {
        state.withLock { $0.waiting[fd] = Waiting(uid: uid, since: MonotonicClock.nanoseconds()) }
    }

    /// The wait is over (a request, its end, or an error); true when `makeRoom` ended it.
    func stopsWaiting(fd: Int32) -> Bool {
        state.withLock { $0.waiting.removeValue(forKey: fd)?.ended ?? false }
    }

    /// For a newcomer of `uid` refused at its cap: ends `uid`'s kept connection that has waited
    /// longest. Its reading side is shut: the broker reads only what was already sent (a
    /// request that raced this is answered *busy*, unread by the gate), and the client's next
    /// send fails, so it reconnects. False when `uid` has no kept connection waiting.
    @discardableResult
    func makeRoom(uid: UInt32) -> Bool {
        state.withLock { s in
            guard let oldest = s.waiting.filter({ $0.value.uid == uid && !$0.value.ended })
                .min(by: { $0.value.since < $1.value.since })?.key else { return false }
            s.waiting[oldest]?.ended = true
            // Under the lock: the session removes its entry here before it closes `oldest`.
            shutdown(oldest, Int32(SHUT_RD))
            return true
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
