import Glibc
import Synchronization
import KeyholdAuth
import KeyholdCore
import KeyholdProtocol

/// The broker's shared state: the store (one SQLite connection, used under a lock: every
/// store call is short; PAM never runs while it is held), the release gate, the audit trail.
public final class Broker: Sendable {
    let gate: ReleaseGate
    let syslog: AuditSyslog
    private let store: Mutex<VaultStore>

    init(store: consuming sending VaultStore, gate: ReleaseGate, syslog: AuditSyslog) {
        self.store = Mutex(store)
        self.gate = gate
        self.syslog = syslog
    }

    func withStore<R: Sendable>(_ body: (VaultStore) -> R) -> R {
        store.withLock { body($0) }
    }

    /// Commits one audit entry. False when it could not be written: the caller then answers
    /// *audit unavailable* and releases nothing.
    @discardableResult
    func audit(_ event: AuditEvent) -> Bool {
        let record = event.record()
        let ok = withStore { store -> Bool in
            do throws(StoreError) {
                try store.append(record)
                return true
            } catch {
                return false
            }
        }
        committed(record, ok)
        return ok
    }

    /// After an audit entry's transaction: its copy to the system log, or the failure.
    func committed(_ record: AuditRecord, _ ok: Bool) {
        if ok {
            syslog.record(record)
        } else {
            log("audit entry could not be written; request refused")
            syslog.send("audit-unavailable op=\(record.operation.rawValue) uid=\(record.callerUID) pid=\(record.callerPID)")
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
