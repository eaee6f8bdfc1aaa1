import KeyholdCore
import KeyholdVault

/// Failed attempts are counted before a guess is checked, and counting fails closed (issue 8,
/// item 4).
///
/// Before a PAM transaction (or an application password) is checked, an attempt is reserved:
/// first the uid's slot — one authentication in flight per uid — then, under the store lock,
/// the lockout record is read, checked and written *as if this attempt had already failed*.
/// Only a success gives it back (the record is reset). So parallel guesses cannot all reach
/// PAM before the first failure is written, a guess abandoned half way (cancel, crash, a killed
/// helper) still counts, and a record that cannot be read or written refuses the attempt
/// instead of letting it through. Used by the release gate only.
final class AuthenticationLedger: Sendable {
    private let inFlight = InFlightUIDs()

    /// A second authentication of a uid while one is in flight: *busy*, nothing checked.
    static let inProgress = "another authentication of this user is in progress; try again when it ends"
    static let unrecorded = Denial(.auditUnavailable, "the failed-attempt count could not be recorded; nothing was checked")

    func reserve(uid: UInt32, store: any LockoutStore, now: Int64) -> Result<AuthenticationAttempt, Denial> {
        guard inFlight.reserve(uid) else {
            return .failure(Denial(.busy, Self.inProgress))
        }
        // From here the slot is the attempt's: released when it goes away, whatever happens.
        let attempt = AuthenticationAttempt(uid: uid, store: store, ledger: self)
        return Self.countFailure(uid: uid, store: store, now: now).map { attempt }
    }

    /// Writes one failure ahead of the guess it stands for, unless the uid is locked out.
    static func countFailure(uid: UInt32, store: any LockoutStore, now: Int64) -> Result<Void, Denial> {
        var lockedFor: UInt64?
        let written = store.updateLockout(uid: uid) { current in
            lockedFor = ReleaseGate.lockoutLeft(current, now: now)
            return lockedFor == nil ? ReleaseGate.afterFailure(current, now: now) : nil
        }
        guard case .success = written else { return .failure(unrecorded) }
        if let left = lockedFor { return .failure(Denial(.lockedOut, nil, secondsLeft: left)) }
        return .success(())
    }

    fileprivate func release(_ uid: UInt32) {
        inFlight.release(uid)
    }
}

/// One reserved authentication: already counted as a failure until `succeeded()`.
final class AuthenticationAttempt: Sendable {
    let uid: UInt32
    private let store: any LockoutStore
    private let ledger: AuthenticationLedger

    fileprivate init(uid: UInt32, store: any LockoutStore, ledger: AuthenticationLedger) {
        self.uid = uid
        self.store = store
        self.ledger = ledger
    }

    /// One more guess within this attempt (a password tried again in the same request),
    /// counted before PAM checks it, as the first was; refused once the uid is locked out.
    func countAnother(now: Int64) -> Result<Void, Denial> {
        AuthenticationLedger.countFailure(uid: uid, store: store, now: now)
    }

    /// Gives the attempt back: the uid's count starts again. False when that could not be
    /// written; the caller then refuses (the attempt stays counted).
    func succeeded() -> Bool {
        if case .success = store.updateLockout(uid: uid, { _ in LockoutRecord(uid: self.uid) }) { return true }
        return false
    }

    deinit { ledger.release(uid) }
}
