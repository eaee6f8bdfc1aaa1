import Synchronization

/// One application-password sealing (the Argon2id derivation of a `put` under `+app-password`)
/// in flight per uid: a second one of the same uid is *busy* at once, so one user cannot fill
/// the derivation slots (`PasswordHashingSlots`) and make other users' application passwords
/// wait behind theirs. Checking an application password is one per uid already
/// (`AuthenticationLedger`).
final class SealingReservations: Sendable {
    private let inFlight = Mutex<Set<UInt32>>([])

    static let busy = Denial(.busy, "another item of this user is being sealed under an application password; try again when it ends")

    /// False when `uid` has a sealing in flight.
    func reserve(_ uid: UInt32) -> Bool { inFlight.withLock { $0.insert(uid).inserted } }

    func release(_ uid: UInt32) { inFlight.withLock { _ = $0.remove(uid) } }
}
