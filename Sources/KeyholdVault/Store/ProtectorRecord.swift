import KeyholdCore

/// Which key protector and which TPM rollback counter protect this vault (issue 36 item 2),
/// in `vault_meta` row `key_protector`, MAC'd under the audit key: someone who can write the
/// state directory but has not the vault key cannot forge or edit it, and a key file of an
/// older key (before `--migrate-key-protector tpm` made a new one) cannot vouch for it either.
///
/// The record says what the vault must be opened with; the TPM says whether the vault ever was
/// moved to it (a counter at `counterIndex` exists): a copy made before the move carries no
/// TPM record, but its index is the one the move used, so the start finds the counter and
/// refuses the copy (KeyProtectorStart in the broker).
public struct ProtectorRecord: Sendable, Equatable {
    /// Where the TPM counter is in its life. Each state is written in the transaction of the
    /// step that reaches it, so a kill at any point leaves a state the next start or a second
    /// run of the migration finishes.
    public enum Counter: UInt8, Sendable {
        /// No counter belongs to this vault (a file vault).
        case none = 0
        /// A TPM vault whose counter is still to be made (or replaced: a pre-issue-36 counter
        /// anyone in the TPM's group could write); the next start or migration makes it.
        case pending = 1
        /// The counter exists, writable only with this vault key's counter authorization.
        case established = 2
        /// Moving to `file`: the counter is still to be removed.
        case retiring = 3
    }

    public var kind: KeyProtectorKind
    public var counterIndex: UInt32
    public var counter: Counter

    public init(kind: KeyProtectorKind, counterIndex: UInt32, counter: Counter) {
        self.kind = kind; self.counterIndex = counterIndex; self.counter = counter
    }

    static let rowName = "key_protector"

    func encoded() -> [UInt8] {
        var e = CanonicalEncoder(domain: "keyhold key protector v1")
        e.append(kind.rawValue)
        e.append(counterIndex)
        e.append(counter.rawValue)
        return e.bytes
    }

    static func decode(_ body: [UInt8]) -> ProtectorRecord? {
        var d = CanonicalDecoder(body)
        guard d.expect("keyhold key protector v1"), let kindText = d.text(), let kind = KeyProtectorKind(rawValue: kindText),
              let index = d.uint32(), let c = d.uint8(), let counter = Counter(rawValue: c), d.isAtEnd else { return nil }
        return ProtectorRecord(kind: kind, counterIndex: index, counter: counter)
    }
}

extension VaultStore {
    /// The verified record; nil for a vault that never had one (made before issue 36).
    /// `.integrity` when the row was altered or written under another vault key.
    public func protectorRecord() throws(StoreError) -> ProtectorRecord? {
        guard let stored = try mapped({ () throws(DatabaseError) in try Self.protectorRow(db) }) else { return nil }
        guard stored.count > KeyedHash.byteCount else { throw .integrity }
        let body = Array(stored.dropLast(KeyedHash.byteCount))
        guard KeyedHash.equal(Array(stored.suffix(KeyedHash.byteCount)), KeyedHash.hash(body, key: auditKey)),
              let record = ProtectorRecord.decode(body) else { throw .integrity }
        return record
    }

    /// Writes `record`, with `audit` (the migration step's entry) in the same transaction.
    public func recordProtector(_ record: ProtectorRecord, audit: AuditRecord?) throws(StoreError) {
        if let audit { try checkAuditSize(audit) }
        try db.transaction(mapError: { StoreError.from($0) }) { () throws(StoreError) in
            try mapped { () throws(DatabaseError) in try writeProtectorRow(record) }
            if let audit { try writeAudit(audit) }
        }
    }

    /// Inside the caller's transaction, MAC'd under this store's audit key (into `target`: the
    /// database being re-keyed to this store's keys).
    func writeProtectorRow(_ record: ProtectorRecord, into target: Database? = nil) throws(DatabaseError) {
        let body = record.encoded()
        try (target ?? db).withStatement("""
            INSERT INTO vault_meta (name, value) VALUES (?1, ?2)
            ON CONFLICT (name) DO UPDATE SET value = excluded.value
            """) { (s) throws(DatabaseError) in
            try s.bind(1, text: ProtectorRecord.rowName)
            try s.bind(2, blob: body + KeyedHash.hash(body, key: auditKey))
            try s.step()
        }
    }

    static func protectorRow(_ db: Database) throws(DatabaseError) -> [UInt8]? {
        try db.withStatement("SELECT value FROM vault_meta WHERE name = ?1") { (s) throws(DatabaseError) in
            try s.bind(1, text: ProtectorRecord.rowName)
            return try s.step() ? s.blob(0) : nil
        }
    }

    /// The NV index of this vault's TPM counter when no record names one (a vault made before
    /// issue 36): owner range, "KH" and 16 bits of the audit key, so a restored copy of the
    /// same vault finds the same counter and another vault does not.
    public var defaultCounterIndex: UInt32 {
        let h = KeyedHash.hash(Array("keyhold rollback counter index v1".utf8), key: auditKey)
        return 0x014B_0000 | UInt32(h[0]) << 8 | UInt32(h[1])
    }

    /// The counter's authorization value: only a holder of this vault key can write the
    /// counter. A new vault key (`rekey`) gives a new value.
    public var rollbackCounterAuth: SecureBytes {
        SecureBytes(copying: KeyedHash.hash(Array("keyhold rollback counter auth v1".utf8), key: auditKey))
    }

    /// The check value of `key` as the vault records it (`key_check`).
    static func keyCheckValue(_ key: VaultKey) -> [UInt8] {
        KeyedHash.hash(Array("keyhold key check v1".utf8), key: key.keyCheckKey)
    }

    /// Whether two keys are the same key (compared through their check values).
    public static func sameKey(_ a: VaultKey, _ b: VaultKey) -> Bool { KeyedHash.equal(keyCheckValue(a), keyCheckValue(b)) }

    /// Which of `keys` the vault in `stateDirectory` was written under (its `key_check`), read
    /// without opening the store; nil when none is. Chooses among the key files a migration
    /// can leave side by side.
    public static func matchingKey(_ keys: [VaultKey], stateDirectory: String) throws(StoreError) -> Int? {
        let stored = try readMeta(stateDirectory) { (db) throws(DatabaseError) in
            try db.withStatement("SELECT value FROM vault_meta WHERE name = 'key_check'") { (s) throws(DatabaseError) in
                try s.step() ? s.blob(0) : nil
            }
        }
        guard let stored else { return nil }
        return keys.firstIndex { KeyedHash.equal(stored, keyCheckValue($0)) }
    }

    /// The protector kind the record names, NOT verified (no key opens the vault): only to
    /// word a refusal (a key file that does not open a vault recorded as TPM-protected).
    public static func unverifiedProtectorKind(stateDirectory: String) -> KeyProtectorKind? {
        guard let row = try? readMeta(stateDirectory, { (db) throws(DatabaseError) in try protectorRow(db) }),
              row.count > KeyedHash.byteCount else { return nil }
        return ProtectorRecord.decode(Array(row.dropLast(KeyedHash.byteCount)))?.kind
    }

    private static func readMeta<R>(_ stateDirectory: String, _ body: (Database) throws(DatabaseError) -> R?) throws(StoreError) -> R? {
        let path = stateDirectory + "/" + StateDirectory.databaseFileName
        guard try StateDirectory.exists(path) else { return nil }
        try StateDirectory.checkExistingFile(path)
        do {
            let db = try Database(path: path, readOnly: true)
            defer { db.close() }
            return try body(db)
        } catch {
            // Not a vault (yet): the open that follows says what it is.
            return nil
        }
    }
}
