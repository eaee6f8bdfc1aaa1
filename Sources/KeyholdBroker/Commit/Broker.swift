import Glibc
import Synchronization
import KeyholdCore
import KeyholdVault
import KeyholdProtocol

/// The broker's shared state: the store (one SQLite connection, used under a lock: every
/// store call is short; PAM never runs while it is held), one read-only connection for the
/// reads a caller can make long (`longRead`: never a release), the release gate, the audit trail.
public final class Broker: Sendable {
    let gate: ReleaseGate
    let syslog: AuditSyslog
    /// Per-uid bound on audit growth, and the free space kept for the broker's own writes.
    let budget = AuditBudget()
    let reserve: FreeSpaceReserve
    let leases = RotationLeases()
    /// How the vault key is kept, for `keyhold status`.
    let protection: VaultProtection
    /// `--rollback-anchor`: moved after every store call (RollbackAnchor.swift).
    let anchor: RollbackAnchor?
    /// With the TPM protector: the NV counter, advanced after changes that matter.
    let counter: TPMRollbackCounter?
    /// Set when a request's rollback check failed: every later request gets it (RollbackWatch.swift).
    let rollbackRefusal = Mutex<String?>(nil)
    private let store: BlockingMutex<VaultStore>
    /// The reads a caller can make long (`LongReads`: pages of `list`, `search` and `audit`, and
    /// `audit verify`), on a reader of their own, so they never hold the store that releases
    /// wait for. nil when it could not be opened: they then run on the writer. Closed before
    /// the store. It holds no secret it could release: `LongReads` has no such read.
    private let longReader: BlockingMutex<VaultReader>?
    /// The store's Argon2id limits, read once: application passwords are derived before the
    /// store is locked (AppPasswordKey).
    let passwordHashing: PasswordHashStrength
    /// Concurrent callers' audit entries (and the changes they belong to) share one commit.
    let group = GroupCommit()
    /// One application-password sealing in flight per uid.
    let sealing = InFlightUIDs()
    /// One `audit verify` in flight per uid.
    let verifying = InFlightUIDs()

    init(store: consuming sending VaultStore, gate: ReleaseGate, syslog: AuditSyslog, reserve: FreeSpaceReserve,
         protection: VaultProtection = VaultProtection(keyProtector: .file), anchor: RollbackAnchor? = nil,
         counter: TPMRollbackCounter? = nil) {
        self.reserve = reserve
        self.protection = protection
        self.anchor = anchor
        self.counter = counter
        self.passwordHashing = store.passwordHashing
        var refusal: StoreError?
        do throws(StoreError) { self.longReader = BlockingMutex(try VaultReader.open(for: store)) } catch {
            refusal = error
            self.longReader = nil
        }
        self.store = BlockingMutex(store)
        self.gate = gate
        self.syslog = syslog
        if let refusal {
            let why = refusal == .integrity ? "the file at the vault's path is not the one the broker opened" : "\(refusal)"
            log("no read-only connection for long reads (\(why)); lists, searches and audit pages hold the store lock")
        }
    }

    /// What the long-read reader answers once a rollback was seen (RollbackWatch.swift): the
    /// closed store's answer, as the writer path gives; nil while none was.
    private var readerRefusal: Denial? {
        rollbackRefusal.withLock { $0 == nil } ? nil : Denial(StoreError.closed.outcome)
    }

    /// `read` on the long-read reader; on the writer, under the store lock, when there is none.
    func longRead<R: Sendable>(_ read: (any LongReads) throws(StoreError) -> R) -> Result<R, Denial> {
        if let longReader {
            return longReader.withLock { reader in
                if let refused = readerRefusal { return .failure(refused) }
                return Self.run(read, on: reader)
            }
        }
        return withStore { store in Self.run(read, on: store) }
    }

    private static func run<R>(_ read: (any LongReads) throws(StoreError) -> R, on source: any LongReads) -> Result<R, Denial> {
        do throws(StoreError) { return .success(try read(source)) } catch { return .failure(Denial(error.outcome)) }
    }

    func withStore<R: Sendable>(_ body: (VaultStore) -> R) -> R {
        store.withLock { store in
            // Rollback checks around every store access: RollbackWatch.swift.
            watchRollbackGuards(store)
            let result = body(store)
            advanceRollbackGuards(store)
            return result
        }
    }

    /// Commits one audit entry. False when it could not be written: the caller then answers
    /// *audit unavailable* and releases nothing.
    @discardableResult
    func audit(_ event: AuditEvent) -> Bool {
        audit(event.record())
    }

    /// Commits one entry already built (a release's or a change's entry goes with its work instead).
    @discardableResult
    func audit(_ record: AuditRecord) -> Bool {
        if case .success = transact(record, { (store) throws(StoreError) in try store.append(record) }) {
            return true
        }
        return false
    }

    /// Audit, then act: `body` writes `record` and the change or release it belongs to, as one
    /// member of a group commit (a nested transaction: its failure undoes all it wrote). Its
    /// value is returned only once the commit holding the entry is durable; if that commit
    /// fails, `discard` gets the value (to wipe a secret) and the result is `.auditWriteFailed`.
    /// The entry's system-log copy follows the commit.
    func transact<R>(_ record: AuditRecord, _ body: (VaultStore) throws(StoreError) -> R,
                     discard: (R) -> Void = { _ in }) -> Result<R, StoreError> {
        var result: Result<R, StoreError> = .failure(.auditWriteFailed)
        let committed = group.run({ store in
            do throws(StoreError) {
                result = .success(try store.memberTransaction { () throws(StoreError) in try body(store) })
                return true
            } catch {
                result = .failure(error)
                return false
            }
        }, withStore: { work in withStore(work) })
        return settle(record, result, committed: committed, discard: discard)
    }

    /// What a member's caller gets once its group is finished: nothing of a group whose commit
    /// failed (`discard` wipes what the member had produced).
    private func settle<R>(_ record: AuditRecord, _ result: Result<R, StoreError>, committed: Bool,
                           discard: (R) -> Void) -> Result<R, StoreError> {
        var result = result
        if case .success(let value) = result, !committed {
            discard(value)
            result = .failure(.auditWriteFailed)
        }
        switch result {
        case .success: self.committed(record, true)
        case .failure(.auditWriteFailed): self.committed(record, false)
        case .failure: break  // refused before anything was written (its denial is audited apart)
        }
        return result
    }

    /// After an audit entry's transaction: its copy to the system log, or the failure.
    func committed(_ record: AuditRecord, _ ok: Bool) {
        if ok {
            budget.charge(uid: record.callerUID, bytes: AuditBudget.cost(record))
            syslog.record(record)
        } else {
            log("audit entry could not be written; request refused")
            syslog.send("audit-unavailable op=\(record.operation.rawValue) uid=\(record.callerUID) pid=\(record.callerPID)")
        }
    }

    func close() {
        store.withLock { closeVault($0) }
    }

    /// The reader first: the writer's close is then the last, which checkpoints and removes the
    /// WAL. Called with the store lock held.
    func closeVault(_ store: VaultStore) {
        longReader?.withLock { $0.close() }
        store.close()
    }

    /// One line to stderr (the journal under systemd). Never a secret, service or account.
    func log(_ line: String) {
        let text = "keyholdd: \(line)\n"
        _ = text.withCString { write(2, $0, strlen($0)) }
    }
}
