import KeyholdAuth
import KeyholdCore
import KeyholdVault
import KeyholdProtocol

/// How the release gate talks to the person behind a request. The broker's implementation is
/// the caller's socket (`SocketConversation`); the gate's unit tests script one.
protocol Conversation {
    /// Who is asking (verified) and why (the caller's words), before any prompt. False: the
    /// caller is gone.
    func announce(_ announcement: Announcement) -> Bool
    /// An info or error line from PAM. False: the caller is gone.
    func notify(_ style: Notice.Style, _ text: String) -> Bool
    /// A prompt and the person's answer (or a cancel).
    func ask(_ prompt: Prompt) -> PAMAnswer
    /// Readable when the caller cancels or goes away (polled while PAM runs); nil: none.
    var interruptFD: Int32? { get }
}

/// The gate's time, in µs since the epoch: lockout and reuse windows. Tests set it.
protocol GateClock: Sendable {
    func microseconds() -> Int64
}

struct SystemClock: GateClock {
    func microseconds() -> Int64 { currentMicroseconds() }
}

/// What the gate keeps in the vault: the per-uid lockout record, and the one check of an
/// application password (opening the item's secret, which is then wiped). Every call holds the
/// store for its whole read-check-write.
protocol LockoutStore: Sendable {
    func lockout(uid: UInt32) -> Result<LockoutRecord, StoreError>
    /// Reads the record and, unless `change` returns nil, writes what it returns; the record read.
    func updateLockout(uid: UInt32, _ change: (LockoutRecord) -> LockoutRecord?) -> Result<LockoutRecord, StoreError>
    /// Opens the item's secret with the key (derived before, outside any lock) and wipes it.
    func checkAppPassword(_ item: StoredItem, _ key: AppPasswordKey) -> Result<Void, StoreError>
}

/// What the gate grants: how the policy was satisfied, and the application-password key it
/// checked (the caller opens or re-seals the secret with it; its bytes are guarded memory).
struct Authorization {
    var method: AuthMethod
    var appPassword: AppPasswordKey?

    func wipe() { appPassword?.wipe() }
}

extension VaultStore {
    /// `LockoutStore`'s operations on an open vault, for whoever holds its lock.
    func updateLockoutRecord(uid: UInt32, _ change: (LockoutRecord) -> LockoutRecord?) -> Result<LockoutRecord, StoreError> {
        do throws(StoreError) {
            let current = try lockout(uid: uid)
            if let next = change(current) { try setLockout(next) }
            return .success(current)
        } catch {
            return .failure(error)
        }
    }

    func checkAppPassword(_ item: StoredItem, _ key: AppPasswordKey) -> Result<Void, StoreError> {
        do throws(StoreError) {
            try openSecret(item, appPassword: key).wipe()
            return .success(())
        } catch {
            return .failure(error)
        }
    }

    func lockoutRecord(uid: UInt32) -> Result<LockoutRecord, StoreError> {
        do throws(StoreError) { return .success(try lockout(uid: uid)) } catch { return .failure(error) }
    }
}

extension Broker: LockoutStore {
    func lockout(uid: UInt32) -> Result<LockoutRecord, StoreError> {
        withStore { $0.lockoutRecord(uid: uid) }
    }
    func updateLockout(uid: UInt32, _ change: (LockoutRecord) -> LockoutRecord?) -> Result<LockoutRecord, StoreError> {
        let result = withStore { $0.updateLockoutRecord(uid: uid, change) }
        if case .failure = result { log("lockout record could not be read or written; authentication refused") }
        return result
    }
    func checkAppPassword(_ item: StoredItem, _ key: AppPasswordKey) -> Result<Void, StoreError> {
        withStore { $0.checkAppPassword(item, key) }
    }
}
