import Synchronization

/// The uids that have one operation of a kind in flight: a second one of the same uid is
/// refused at once (*busy*) rather than queued. The release gate keeps one for authentications
/// (`AuthenticationLedger`: parallel guesses), the broker one for application-password
/// sealings (`put` under `+app-password`: one user cannot fill the Argon2id slots,
/// `PasswordHashingSlots`, and make other users' application passwords wait behind theirs).
final class InFlightUIDs: Sendable {
    private let uids = Mutex<Set<UInt32>>([])

    /// False when `uid` already has one in flight.
    func reserve(_ uid: UInt32) -> Bool { uids.withLock { $0.insert(uid).inserted } }

    func release(_ uid: UInt32) { uids.withLock { _ = $0.remove(uid) } }
}
