import Glibc
import Synchronization
import KeyholdAuth
import KeyholdCore
import KeyholdVault
import KeyholdProtocol

/// The broker's shared state: the store (one SQLite connection, used under a lock: every
/// store call is short; PAM never runs while it is held), read-only connections for the lookup
/// a release is decided on (`readers`), the release gate, the audit trail.
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
    /// Lookups for `get` and `rotate` (ReaderPool.swift); closed before the store.
    let readers: ReaderPool
    /// Rows the event loop's workers looked up, kept while the writer changes no item
    /// (ReleaseRowCache.swift).
    let releaseRows: ReleaseRowCache
    /// The reads a caller can make long (`LongReads`: pages of `list`, `search` and `audit`, and
    /// `audit verify`), on a reader of their own: they hold neither the store nor the lookups'
    /// readers. Closed before the store.
    let longReader: ReaderPool
    /// The store's Argon2id limits, read once: application passwords are derived before the
    /// store is locked (AppPasswordKey).
    let passwordHashing: PasswordHashStrength
    /// Concurrent callers' audit entries (and the changes they belong to) share one commit.
    let group = GroupCommit()
    /// One application-password sealing in flight per uid.
    let sealing = InFlightUIDs()
    /// `audit verify`: a reader of its own per verify, bounded (AuditVerifyReaders.swift).
    let verifyReaders: AuditVerifyReaders
    /// Opens a release's secret off the store lock; the writer decides whether it is released.
    let secretOpener: SecretOpener

    init(store: consuming sending VaultStore, gate: ReleaseGate, syslog: AuditSyslog, reserve: FreeSpaceReserve,
         protection: VaultProtection = VaultProtection(keyProtector: .file), anchor: RollbackAnchor? = nil,
         counter: TPMRollbackCounter? = nil) {
        self.reserve = reserve
        self.protection = protection
        self.anchor = anchor
        self.counter = counter
        self.passwordHashing = store.passwordHashing
        var refusal: StoreError?
        do throws(StoreError) { self.readers = try ReaderPool.open(count: Self.readerCount, of: store) } catch {
            refusal = error
            self.readers = ReaderPool()
        }
        var longRefused = false
        do throws(StoreError) { self.longReader = refusal == nil ? try ReaderPool.open(count: 1, of: store) : ReaderPool() } catch {
            longRefused = true
            self.longReader = ReaderPool()
        }
        self.verifyReaders = AuditVerifyReaders(store.readerSeed)
        self.secretOpener = store.secretOpener
        self.releaseRows = ReleaseRowCache(version: store.itemRowsVersion)
        self.store = BlockingMutex(store)
        self.gate = gate
        self.syslog = syslog
        if let refusal { log("no read-only connection to the vault (\(Self.why(refusal))); lookups wait for the store lock") }
        if longRefused { log("no read-only connection for long reads; lists, searches and audit pages hold the store lock") }
    }

    /// Why a reader was not opened, for the log.
    static func why(_ refusal: StoreError) -> String {
        refusal == .integrity ? "the file at the vault's path is not the one the broker opened" : "\(refusal)"
    }

    /// Read-only connections: one per core of the machines this is measured on (two).
    static let readerCount = 2

    /// The item of `owner` named by `ref` with its sealed row, read on a reader connection for
    /// a release decision (the writer confirms the row before anything is released:
    /// `VaultStore.openConfirmed`). nil when there is no reader: the caller asks the writer.
    /// Fails closed as the writer path does: once a rollback was seen (RollbackWatch.swift) or
    /// the store closed, the answer is the closed store's.
    func readReleaseRow(owner: UInt32, _ ref: ItemReference) -> Result<ReleaseRow?, Denial>? {
        readers.withReader { reader in
            if let refused = readerRefusal { return .failure(refused) }
            do throws(StoreError) {
                return .success(try reader.releaseRow(owner: owner, service: ref.service, account: ref.account))
            } catch {
                return .failure(Denial(error.outcome))
            }
        }
    }

    /// What every reader answers once a rollback was seen (RollbackWatch.swift): the closed
    /// store's answer, as the writer path gives; nil while none was.
    private var readerRefusal: Denial? {
        rollbackRefusal.withLock { $0 == nil } ? nil : Denial(StoreError.closed.outcome)
    }

    /// `read` on the long-read reader; on the writer, under the store lock, when there is none.
    /// Fails closed as `readReleaseRow` does.
    func longRead<R: Sendable>(_ read: (any LongReads) throws(StoreError) -> R) -> Result<R, Denial> {
        if let page = longReader.withReader({ reader -> Result<R, Denial> in
            if let refused = readerRefusal { return .failure(refused) }
            return Self.run(read, on: reader)
        }) {
            return page
        }
        return withStore { store in Self.run(read, on: store) }
    }

    /// `audit verify`'s read of `uid`: on a reader opened for it (AuditVerifyReaders.swift), so
    /// it holds up no other caller's long read; *busy* beyond its bounds. Where that reader
    /// cannot be opened, logged, and read as `longRead` reads.
    func verifyRead<R: Sendable>(uid: UInt32, _ read: (any LongReads) throws(StoreError) -> R) -> Result<R, Denial> {
        verifyReaders.read(uid: uid, refusal: { readerRefusal }, { reader in Self.run(read, on: reader) }, fallback: { refusal in
            let instead = longReader.isEmpty ? "it holds the store lock" : "it runs on the shared long-read reader"
            log("no read-only connection for an audit verify (\(Self.why(refusal))); \(instead)")
            return longRead(read)
        })
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
        if case .success = transact(record, writes: .oneAppendLast, { (store) throws(StoreError) in try store.append(record) }) {
            return true
        }
        return false
    }

    /// Audit, then act: `body` writes `record` and the change or release it belongs to, as one
    /// member of a group commit. Its value is returned only once the commit holding the entry
    /// is durable; if that commit fails, `discard` gets the value (to wipe a secret) and the
    /// result is `.auditWriteFailed`. The entry's system-log copy follows the commit.
    func transact<R>(_ record: AuditRecord, writes: MemberWrites = .any, _ body: (VaultStore) throws(StoreError) -> R,
                     discard: (R) -> Void = { _ in }) -> Result<R, StoreError> {
        var result: Result<R, StoreError> = .failure(.auditWriteFailed)
        let committed = group.run({ store in Self.runMember(body, writes: writes, on: store, into: &result) },
                                  withStore: { work in withStore(work) })
        return settle(record, result, committed: committed, discard: discard)
    }

    /// `transact` without waiting for the commit: `then` gets the same result, on the thread
    /// that led the commit (GroupCommit.submit), and must not block.
    func transactWithoutWaiting<R>(_ record: AuditRecord, writes: MemberWrites = .any,
                                   _ body: @escaping (VaultStore) throws(StoreError) -> R,
                                   discard: @escaping (R) -> Void, then: @escaping (Result<R, StoreError>) -> Void) {
        let pending = PendingResult<R>()
        group.submit({ store in Self.runMember(body, writes: writes, on: store, into: &pending.result) },
                     withStore: { [self] work in withStore(work) },
                     completion: { [self] committed in then(settle(record, pending.result, committed: committed, discard: discard)) })
    }

    /// What a member's `body` may write, which decides whether it needs a nested transaction
    /// of its own around it.
    enum MemberWrites {
        /// Anything: `body` runs as a nested transaction, so its failure undoes all it wrote.
        case any
        /// Nothing but one `VaultStore.append`, as its last step (a release, a plain entry).
        /// That append undoes itself when it fails (a nested transaction, or inside a group that
        /// defers the head its one INSERT), so a failure anywhere in `body` leaves nothing of
        /// it: a nested transaction around it would only cost the leader, which every member of
        /// the group waits for, two statements per member.
        case oneAppendLast
    }

    /// A member's part, as a nested transaction of its group's (or, for `.oneAppendLast`, with
    /// its one nested transaction its own append): false rolls back this member alone.
    private static func runMember<R>(_ body: (VaultStore) throws(StoreError) -> R, writes: MemberWrites, on store: VaultStore,
                                     into result: inout Result<R, StoreError>) -> Bool {
        do throws(StoreError) {
            switch writes {
            case .any: result = .success(try store.memberTransaction { () throws(StoreError) in try body(store) })
            case .oneAppendLast: result = .success(try body(store))
            }
            return true
        } catch {
            result = .failure(error)
            return false
        }
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

    /// Readers first: the writer's close is then the last, which checkpoints and removes the
    /// WAL. Called with the store lock held.
    func closeVault(_ store: VaultStore) {
        readers.close()
        longReader.close()
        verifyReaders.close()
        store.close()
    }

    /// One line to stderr (the journal under systemd). Never a secret, service or account.
    func log(_ line: String) {
        let text = "keyholdd: \(line)\n"
        _ = text.withCString { write(2, $0, strlen($0)) }
    }
}

/// A submitted member's result, written by the leader inside the group and read by the
/// completion after it (GroupCommit orders the two under its mutex).
private final class PendingResult<R>: @unchecked Sendable {
    var result: Result<R, StoreError> = .failure(.auditWriteFailed)
}
