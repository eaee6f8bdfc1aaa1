import Synchronization
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
/// instead of letting it through.
final class AuthenticationLedger: Sendable {
    private let inFlight = Mutex<Set<UInt32>>([])

    /// A second authentication of a uid while one is in flight: *busy*, nothing checked.
    static let inProgress = "another authentication of this user is in progress; try again when it ends"

    func reserve(uid: UInt32, broker: Broker) -> Result<AuthenticationAttempt, Denial> {
        guard inFlight.withLock({ $0.insert(uid).inserted }) else {
            return .failure(Denial(.busy, Self.inProgress))
        }
        // From here the slot is the attempt's: released when it goes away, whatever happens.
        let attempt = AuthenticationAttempt(uid: uid, broker: broker, ledger: self)
        let counted: Denial? = broker.withStore { store in
            do throws(StoreError) {
                let now = currentMicroseconds()
                let current = try store.lockout(uid: uid)
                if let left = ReleaseGate.lockoutLeft(current, now: now) {
                    return Denial(.lockedOut, nil, secondsLeft: left)
                }
                try store.setLockout(ReleaseGate.afterFailure(current, now: now))
                return nil
            } catch {
                return Self.unrecorded
            }
        }
        if let counted {
            if counted.outcome == .auditUnavailable { broker.log("lockout record could not be read or written; authentication refused") }
            return .failure(counted)
        }
        return .success(attempt)
    }

    static let unrecorded = Denial(.auditUnavailable, "the failed-attempt count could not be recorded; nothing was checked")

    fileprivate func release(_ uid: UInt32) {
        inFlight.withLock { _ = $0.remove(uid) }
    }
}

/// One reserved authentication: already counted as a failure until `succeeded()`.
final class AuthenticationAttempt: Sendable {
    let uid: UInt32
    private let broker: Broker
    private let ledger: AuthenticationLedger

    fileprivate init(uid: UInt32, broker: Broker, ledger: AuthenticationLedger) {
        self.uid = uid
        self.broker = broker
        self.ledger = ledger
    }

    /// Gives the attempt back: the uid's count starts again. False when that could not be
    /// written; the caller then refuses (the attempt stays counted).
    func succeeded() -> Bool {
        broker.withStore { succeededHoldingStore($0) }
    }

    deinit { ledger.release(uid) }
}

extension AuthenticationAttempt {
    /// `succeeded()` for a caller that already holds the store (the lock is not re-entrant).
    func succeededHoldingStore(_ store: VaultStore) -> Bool {
        do throws(StoreError) {
            try store.setLockout(LockoutRecord(uid: uid))
            return true
        } catch {
            return false
        }
    }
}

extension Session {
    /// The caller's lockout record; an error reading it refuses (never "not locked out").
    func readLockout() -> Result<LockoutRecord, Denial> {
        broker.withStore { store in
            do throws(StoreError) {
                return .success(try store.lockout(uid: caller.uid))
            } catch {
                return .failure(AuthenticationLedger.unrecorded)
            }
        }
    }
}
