import Glibc
import Synchronization
import KeyholdCore

/// Exclusive rotation leases, in the broker's memory only: at most one connection rotates an
/// item at a time. A lease belongs to the session that took it and is released when that
/// session's rotate ends (committed, canceled, timed out, or the connection closed), so a
/// killed `keyhold` frees it as soon as the broker sees the socket close. A broker restart
/// drops them all, which is safe: nothing was committed under a lease that did not finish.
final class RotationLeases: Sendable {
    private let held = Mutex<[ItemID: UInt64]>([:])
    private let nextToken = Atomic<UInt64>(1)

    enum Wait {
        /// The lease is ours; `waited` when another held it first.
        case acquired(token: UInt64, waited: Bool)
        case timedOut
        /// The client closed its connection (or spoke out of turn) while waiting.
        case callerLeft
    }

    /// Takes the lease on `id`, waiting until `deadline` (monotonic ms) for its holder. While
    /// waiting it watches `clientFD`: a caller that left stops waiting at once.
    func acquire(_ id: ItemID, deadline: Int64, clientFD: Int32) -> Wait {
        let token = nextToken.add(1, ordering: .relaxed).newValue
        var waited = false
        while true {
            let taken = held.withLock { h -> Bool in
                if h[id] != nil { return false }
                h[id] = token
                return true
            }
            if taken { return .acquired(token: token, waited: waited) }
            waited = true
            switch Self.pause(clientFD, until: deadline) {
            case .elapsed: return .timedOut
            case .callerLeft: return .callerLeft
            case .again: continue
            }
        }
    }

    func release(_ id: ItemID, token: UInt64) {
        held.withLock { h in if h[id] == token { h[id] = nil } }
    }

    func isHeld(_ id: ItemID) -> Bool { held.withLock { $0[id] != nil } }

    /// Waits until nobody holds a lease on `id` (for `put --update` without `--if-generation`).
    /// False when `deadline` passed or the caller left first.
    func waitUntilFree(_ id: ItemID, deadline: Int64, clientFD: Int32) -> Bool {
        while isHeld(id) {
            if case .again = Self.pause(clientFD, until: deadline) { continue }
            return false
        }
        return true
    }

    private enum Pause { case again, elapsed, callerLeft }

    /// Sleeps a little (holders commit in milliseconds), watching the client's socket.
    private static func pause(_ fd: Int32, until deadline: Int64) -> Pause {
        let left = deadline - MonotonicClock.milliseconds()
        if left <= 0 { return .elapsed }
        var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        return poll(&pfd, 1, Int32(min(left, 5))) > 0 ? .callerLeft : .again
    }
}
