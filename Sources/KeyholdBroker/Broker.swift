import Glibc
import Synchronization
import KeyholdAuth
import KeyholdCore
import KeyholdProtocol

/// The broker's shared state: the store (one SQLite connection, used under a lock: every
/// store call is short; PAM never runs while it is held), the release gate, the audit trail.
public final class Broker: Sendable {
    let gate: ReleaseGate
    private let store: Mutex<VaultStore>

    init(store: consuming sending VaultStore, gate: ReleaseGate) {
        self.store = Mutex(store)
        self.gate = gate
    }

    func withStore<R: Sendable>(_ body: (VaultStore) -> R) -> R {
        store.withLock { body($0) }
    }

    /// Commits one audit entry. False when it could not be written: the caller then answers
    /// *audit unavailable* and releases nothing.
    @discardableResult
    func audit(_ event: AuditEvent) -> Bool {
        let ok = withStore { store -> Bool in
            do throws(StoreError) {
                try store.append(event.record())
                return true
            } catch {
                return false
            }
        }
        if !ok { log("audit entry could not be written") }
        return ok
    }

    func recordFailure(uid: UInt32) {
        withStore { store in
            let now = Clock.microseconds()
            let current = (try? store.lockout(uid: uid)) ?? LockoutRecord(uid: uid)
            try? store.setLockout(ReleaseGate.afterFailure(current, now: now))
        }
    }

    func recordSuccess(uid: UInt32) {
        withStore { store in
            if let current = try? store.lockout(uid: uid), current.failures > 0 || current.lockedUntil > 0 {
                try? store.setLockout(LockoutRecord(uid: uid))
            }
        }
    }

    func close() {
        store.withLock { $0.close() }
    }

    /// One line to stderr (the journal under systemd). Never a secret, service or account.
    func log(_ line: String) {
        let text = "keyholdd: \(line)\n"
        _ = text.withCString { write(2, $0, strlen($0)) }
    }
}
