import Glibc
import Synchronization
import KeyholdCore

/// Exclusive rotation leases: at most one rotation of an item at a time. A lease belongs to
/// the session that took it while it rotates. When that session ends with a commit or a
/// cancel, or before the secret left, the lease is free at once. When it ends any other way
/// after the secret was released (the connection closed: keyhold killed, its host gone), the
/// COMMAND that received the old secret may still be redeeming it, so the lease is kept, cut
/// off, until the rotation's deadline (issue 36 item 1). The vault records each released
/// lease (VaultStore+Leases.swift), so a restarted broker honours the same deadline.
final class RotationLeases: Sendable {
    private enum Holder: Equatable {
        case session(token: UInt64)
        /// No session: a rotation cut off after its release, held until `until` (monotonic ms).
        case cutOff(until: Int64)
    }

    private let held = Mutex<[ItemID: Holder]>([:])
    private let nextToken = Atomic<UInt64>(1)

    enum Wait {
        /// The lease is ours; `waited` when another held it first.
        case acquired(token: UInt64, waited: Bool)
        case timedOut
        /// The client closed its connection (or spoke out of turn) while waiting.
        case callerLeft
    }

    private enum Attempt { case taken, busy(cutOffUntil: Int64?) }

    /// Takes the lease on `id`, waiting until `deadline` (monotonic ms) for its holder; for a
    /// cut-off rotation, until its deadline even past ours, as that end is known and near (at
    /// most the longest lease): the caller's rotate then runs instead of failing. While
    /// waiting it watches `clientFD`: a caller that left stops waiting at once.
    func acquire(_ id: ItemID, deadline: Int64, clientFD: Int32) -> Wait {
        let token = nextToken.add(1, ordering: .relaxed).newValue
        var waited = false
        while true {
            let now = MonotonicClock.milliseconds()
            let attempt = held.withLock { h -> Attempt in
                switch h[id] {
                case .session: return .busy(cutOffUntil: nil)
                case .cutOff(let until) where until > now: return .busy(cutOffUntil: until)
                case .cutOff, nil:
                    h[id] = .session(token: token)
                    return .taken
                }
            }
            guard case .busy(let cutOffUntil) = attempt else { return .acquired(token: token, waited: waited) }
            waited = true
            switch Self.pause(clientFD, until: max(deadline, cutOffUntil.map { $0 + 1 } ?? 0)) {
            case .elapsed: return .timedOut
            case .callerLeft: return .callerLeft
            case .again: continue
            }
        }
    }

    /// The rotation ended before its secret left, or with a commit or a cancel: free now.
    func release(_ id: ItemID, token: UInt64) {
        held.withLock { h in if h[id] == .session(token: token) { h[id] = nil } }
    }

    /// The rotation was cut off after its secret left: held until `until` (monotonic ms).
    func keep(_ id: ItemID, token: UInt64, until: Int64) {
        held.withLock { h in if h[id] == .session(token: token) { h[id] = .cutOff(until: until) } }
    }

    /// A lease the vault recorded (a rotation cut off before this broker started): held until
    /// `until` (monotonic ms) unless a session holds it already.
    func honour(_ id: ItemID, until: Int64) {
        let now = MonotonicClock.milliseconds()
        held.withLock { h in
            switch h[id] {
            case .session: return
            case .cutOff(let current) where current >= until && current > now: return
            case .cutOff, nil: h[id] = .cutOff(until: until)
            }
        }
    }

    func isHeld(_ id: ItemID) -> Bool {
        let now = MonotonicClock.milliseconds()
        return held.withLock { h in
            switch h[id] {
            case .session: true
            case .cutOff(let until): until > now
            case nil: false
            }
        }
    }

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
