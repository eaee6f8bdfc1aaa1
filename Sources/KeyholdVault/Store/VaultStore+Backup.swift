import CSQLite
import Glibc
import KeyholdCore

/// Why a recovery-key, backup or restore step failed. Closed; never carries key bytes.
public enum RecoveryError: Error, Equatable, Sendable, CustomStringConvertible {
    /// The vault has no recovery key: a backup would open nowhere.
    case noRecoveryKey
    /// The recovery wrap does not belong to the current vault key (re-keyed since, or altered).
    case staleRecoveryKey
    /// The typed recovery key is not 56 base32 characters with a matching checksum.
    case mistyped
    /// A well-formed recovery key, but not the one this backup was made under.
    case wrongRecoveryKey(expected: String)
    /// The file is not a Keyhold backup.
    case notABackup
    /// The backup was altered or damaged (its wrap, check value or MAC does not verify).
    case integrity
    case store(StoreError)

    public var description: String {
        switch self {
        case .noRecoveryKey: "the vault has no recovery key; create one first with keyholdd --create-recovery-key (broker stopped)"
        case .staleRecoveryKey: "the vault's recovery key no longer wraps its vault key (re-keyed since); create a new one with keyholdd --create-recovery-key"
        case .mistyped: "that is not a recovery key (56 base32 characters in groups of 4, with a checksum): mistyped?"
        case .wrongRecoveryKey(let id): "wrong recovery key: this backup was made under recovery key \(id)"
        case .notABackup: "not a Keyhold backup file"
        case .integrity: "integrity failure: the backup was altered or damaged"
        case .store(let e): e.description
        }
    }

    public var outcome: Outcome {
        switch self {
        case .integrity: .integrityFailure
        case .wrongRecoveryKey, .mistyped: .authenticationFailed
        case .store(let e): e.outcome
        default: .otherError
        }
    }
}

/// The recovery wrap in `vault_meta` row `recovery_key`: the recovery key's identity, the
/// check value of the vault key it wraps, the wrap; MAC'd under the audit key, so someone who
/// can write the state directory cannot swap in a wrap that looks current and is not.
struct RecoveryRecord {
    static let rowName = "recovery_key"
    let identity: [UInt8]
    let keyCheck: [UInt8]
    let wrap: SealedBox
    let created: Int64

    func encoded() -> [UInt8] {
        var e = CanonicalEncoder(domain: "keyhold recovery record v1")
        e.append(bytes: identity)
        e.append(bytes: keyCheck)
        e.append(bytes: wrap.combined)
        e.append(created)
        return e.bytes
    }

    static func decode(_ body: [UInt8]) -> RecoveryRecord? {
        var d = CanonicalDecoder(body)
        guard d.expect("keyhold recovery record v1"), let id = d.field(maxCount: 64), let check = d.field(maxCount: 64),
              let wrapped = d.field(maxCount: 256), let box = try? SealedBox(combined: wrapped), let t = d.uint64(), d.isAtEnd
        else { return nil }
        return RecoveryRecord(identity: id, keyCheck: check, wrap: box, created: Int64(bitPattern: t))
    }
}

/// What start-up and `keyhold status` say about the recovery key.
public enum RecoveryState: Equatable, Sendable {
    case none
    /// Present, wrapping the current vault key; `identity` in hex.
    case present(identity: String)
    /// A row that does not verify under this vault key (re-keyed since, or altered).
    case stale
}

extension VaultStore {
    private func recoveryRecord() throws(StoreError) -> RecoveryRecord? {
        let stored = try mapped { () throws(DatabaseError) -> [UInt8]? in
            try db.withStatement("SELECT value FROM vault_meta WHERE name = ?1") { (s) throws(DatabaseError) in
                try s.bind(1, text: RecoveryRecord.rowName)
                return try s.step() ? s.blob(0) : nil
            }
        }
        guard let stored else { return nil }
        guard stored.count > KeyedHash.byteCount else { throw .integrity }
        let body = Array(stored.dropLast(KeyedHash.byteCount))
        guard KeyedHash.equal(Array(stored.suffix(KeyedHash.byteCount)), KeyedHash.hash(body, key: auditKey)),
              let record = RecoveryRecord.decode(body) else { throw .integrity }
        return record
    }

    /// `.stale` when the row does not verify under this vault key or wraps another key.
    public func recoveryState() -> RecoveryState {
        do throws(StoreError) {
            guard let record = try recoveryRecord() else { return .none }
            guard KeyedHash.equal(record.keyCheck, try storedKeyCheck()) else { return .stale }
            return .present(identity: Hex.encode(record.identity))
        } catch {
            return .stale
        }
    }

    private func storedKeyCheck() throws(StoreError) -> [UInt8] {
        try mapped { () throws(DatabaseError) -> [UInt8] in
            try db.withStatement("SELECT value FROM vault_meta WHERE name = 'key_check'") { (s) throws(DatabaseError) in
                try s.step() ? s.blob(0) : []
            }
        }
    }

    /// Wraps `vaultKey` (this vault's key: checked against `key_check`) under `recovery` and
    /// records the wrap, replacing any earlier one, with `audit` in the same transaction.
    public func recordRecoveryKey(_ recovery: RecoveryKey, wrapping vaultKey: VaultKey, audit: AuditRecord) throws(StoreError) {
        let check = Self.keyCheckValue(vaultKey)
        guard KeyedHash.equal(check, try storedKeyCheck()) else { throw .keyFileInvalid }
        let body = RecoveryRecord(identity: recovery.identity, keyCheck: check, wrap: recovery.wrap(vaultKey),
                                  created: currentMicroseconds()).encoded()
        try checkAuditSize(audit)
        try db.transaction(mapError: { StoreError.from($0) }) { () throws(StoreError) in
            try mapped { () throws(DatabaseError) in
                try db.withStatement("""
                    INSERT INTO vault_meta (name, value) VALUES (?1, ?2)
                    ON CONFLICT (name) DO UPDATE SET value = excluded.value
                    """) { (s) throws(DatabaseError) in
                    try s.bind(1, text: RecoveryRecord.rowName)
                    try s.bind(2, blob: body + KeyedHash.hash(body, key: auditKey))
                    try s.step()
                }
            }
            try writeAudit(audit)
        }
    }

    /// A consistent copy of the whole database (SQLite's online backup into memory, as one
    /// step, so one read transaction), sealed as a backup file image. Only sealed rows and the
    /// recovery wrap are in it. Run with the store lock held and no transaction open.
    public func backupImage(madeAt: Int64) throws(RecoveryError) -> [UInt8] {
        let found: RecoveryRecord?, check: [UInt8]
        do throws(StoreError) {
            (found, check) = (try recoveryRecord(), try storedKeyCheck())
        } catch { throw error == .integrity ? .staleRecoveryKey : .store(error) }
        guard let record = found else { throw .noRecoveryKey }
        guard KeyedHash.equal(record.keyCheck, check) else { throw .staleRecoveryKey }
        let database: [UInt8]
        do throws(DatabaseError) { database = try db.backupImage() } catch { throw .store(StoreError.from(error)) }
        return VaultBackup.seal(record: record, database: database, madeAt: madeAt, macKey: VaultBackup.macKey(auditKey))
    }
}

/// The backup file: a canonical encoding of (domain, recovery identity, vault key check value,
/// recovery wrap, time made, database image), then a keyed BLAKE2b-256 of all of it under a
/// key derived from the vault key, which only the recovery key's holder can unwrap.
///
/// Opening checks, in order: the recovery key's identity (wrong key: nothing else is
/// tried), the wrap, the check value, the MAC; any failure after the identity is *integrity*.
public enum VaultBackup {
    static let domain: StaticString = "keyhold backup v1"

    static func macKey(_ auditKey: AuditKey) -> MACKey {
        MACKey(keyBytes: SymmetricKeyBytes(SecureBytes(copying: KeyedHash.hash(Array("keyhold backup mac v1".utf8), key: auditKey))))
    }

    static func seal(record: RecoveryRecord, database: [UInt8], madeAt: Int64, macKey: MACKey) -> [UInt8] {
        var e = CanonicalEncoder(domain: "\(domain)")
        e.append(bytes: record.identity)
        e.append(bytes: record.keyCheck)
        e.append(bytes: record.wrap.combined)
        e.append(madeAt)
        e.append(bytes: database)
        return e.bytes + KeyedHash.hash(e.bytes, key: macKey)
    }

    /// A verified backup: the vault key and the database image to restore.
    public struct Opened {
        public let vaultKey: VaultKey
        public let database: [UInt8]
        public let madeAt: Int64
        public let identity: String
    }

    public static func open(_ file: [UInt8], recovery: RecoveryKey) throws(RecoveryError) -> Opened {
        guard file.count > KeyedHash.byteCount else { throw .notABackup }
        let body = Array(file.dropLast(KeyedHash.byteCount))
        var d = CanonicalDecoder(body)
        guard d.expect(domain), let identity = d.field(maxCount: 64), let check = d.field(maxCount: 64),
              let wrapped = d.field(maxCount: 256), let madeAt = d.uint64(), let database = d.field(), d.isAtEnd
        else {
            // The domain label read, then broken: altered, not another kind of file.
            var probe = CanonicalDecoder(body)
            throw probe.expect(domain) ? .integrity : .notABackup
        }
        guard KeyedHash.equal(identity, recovery.identity) else { throw .wrongRecoveryKey(expected: Hex.encode(identity)) }
        let key: VaultKey
        do throws(CryptoError) { key = try recovery.unwrap(try SealedBox(combined: wrapped)) } catch { throw .integrity }
        guard KeyedHash.equal(check, VaultStore.keyCheckValue(key)),
              KeyedHash.equal(Array(file.suffix(KeyedHash.byteCount)), KeyedHash.hash(body, key: macKey(key.auditKey)))
        else { throw .integrity }
        return Opened(vaultKey: key, database: database, madeAt: Int64(bitPattern: madeAt), identity: Hex.encode(identity))
    }
}

extension VaultBackup {
    /// Writes a restored database image as the state directory's `vault.db` (0600, O_EXCL,
    /// never over an existing file), fsynced with its directory.
    public static func writeDatabase(_ image: [UInt8], stateDirectory: String) throws(StoreError) {
        try StateDirectory.prepare(stateDirectory)
        let path = stateDirectory + "/" + StateDirectory.databaseFileName
        let fd = Glibc.open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw .io(code: errno) }
        var failure: Int32 = fchmod(fd, 0o600) == 0 ? 0 : errno
        if failure == 0 { failure = image.withUnsafeBytes { DescriptorIO.writeAll(fd, $0) } }
        if failure == 0, fsync(fd) != 0 { failure = errno }
        Glibc.close(fd)
        guard failure == 0 else { unlink(path); throw .io(code: failure) }
        StateDirectory.syncDirectory(stateDirectory)
    }
}

extension VaultStore {
    /// A restored vault made this machine's: the protector `record` of this machine, the old
    /// machine's rollback counter value dropped (the counter or anchor starts from here), and
    /// the `restore` entry, in one transaction.
    public func adoptRestored(_ record: ProtectorRecord, audit: AuditRecord) throws(StoreError) {
        try checkAuditSize(audit)
        try db.transaction(mapError: { StoreError.from($0) }) { () throws(StoreError) in
            try mapped { () throws(DatabaseError) in
                try db.execute("DELETE FROM vault_meta WHERE name = 'rollback_counter'")
                try writeProtectorRow(record)
            }
            try writeAudit(audit)
        }
    }
}
