import Synchronization

/// Connection slots, fair per uid, so that no local user can take every slot and deny service
/// to the others: non-root uids share one pool with a cap each, the first few connections of
/// any uid are always admitted, and root has a reserve of its own that no one else can use.
/// A uid beyond its share gets a *busy* answer, never a reset. A connection carries one
/// request and holds its slot only until it is closed.
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

    func release(uid: UInt32) {
        state.withLock { s in
            let mine = s.perUID[uid, default: 0] - 1
            s.perUID[uid] = mine > 0 ? mine : nil
            if uid != 0 { s.shared -= 1 }
        }
    }
}

/// A connection's hold on its slot, given back once: just before its answer is written (its
/// client may ask again on a new connection the moment it has the answer, and must find the slot
/// free), or when the connection ends without one. What the session may still do after that is
/// bounded by the socket's send timeout.
final class SlotHold: Sendable {
    private let given = Atomic<Bool>(false)
    private let slots: ConnectionSlots
    private let uid: UInt32

    init(_ slots: ConnectionSlots, uid: UInt32) {
        self.slots = slots
        self.uid = uid
    }

    func giveBack() {
        if !given.exchange(true, ordering: .acquiringAndReleasing) { slots.release(uid: uid) }
    }
}
