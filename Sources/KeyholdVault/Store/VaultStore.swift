import Glibc
import KeyholdCore

/// The encrypted item store of one vault: a state directory holding `vault.key` (0600) and
/// `vault.db` (SQLite, WAL, synchronous=FULL).
///
/// Not Sendable and not thread-safe: the broker serialises every call behind one lock (its
/// long reads may use a `VaultReader` instead, behind its own lock).
/// Every mutating call writes its change and its audit entry in one transaction, so both land
/// or neither does; a call that returns has been committed durably (it survives kill -9).
public final class VaultStore {
    let db: Database
    let wrappingKey: WrappingKey
    let attributeKey: AttributeKey
    let blindIndexKey: BlindIndexKey
    let auditKey: AuditKey
    let generationKey: MACKey
    let searchKey: MACKey
    /// The verified record of each item's current generation (VaultStore+Generation).
    var generationState: GenerationState = .unknown
    /// Argon2id limits for new app-password items (`AppPasswordKey.sealing`).
    public let passwordHashing: PasswordHashStrength
    public let stateDirectory: String
    /// The database, WAL and shared-memory files this store has open (device, inode), which a
    /// `VaultReader` must find at their paths. Set when `open` has read the vault.
    var fileIdentities: [StateDirectory.FileIdentity] = []
    /// A reader's store (VaultReader): it never writes, and sees the writer's commits as another
    /// connection's (VaultStore+Generation).
    let isReader: Bool

    /// The schema version this code writes (the last `-- migrate:N` of schema.sql).
    public static var schemaVersion: Int64 { Schema.knownVersion }
    static let formatName = "keyhold-vault"

    /// The writer's store: its keys from `key`.
    private convenience init(db: Database, key: VaultKey, stateDirectory: String, passwordHashing: PasswordHashStrength) {
        self.init(db: db, isReader: false, ReaderSeed(
            wrappingKey: key.wrappingKey, attributeKey: key.attributeKey, blindIndexKey: key.blindIndexKey, auditKey: key.auditKey,
            generationKey: key.generationKey, searchKey: key.searchKey, fileIdentities: [], stateDirectory: stateDirectory,
            passwordHashing: passwordHashing))
    }

    /// A store's keys and settings; what a reader's store takes from the writer's: Sendable
    /// values only, so a reader is not tied to the writer (it is used on other threads, under
    /// its own lock), and one taken once can open readers later without the writer's lock.
    public struct ReaderSeed: Sendable {
        let wrappingKey: WrappingKey, attributeKey: AttributeKey, blindIndexKey: BlindIndexKey, auditKey: AuditKey
        let generationKey: MACKey, searchKey: MACKey
        let fileIdentities: [StateDirectory.FileIdentity], stateDirectory: String, passwordHashing: PasswordHashStrength
    }

    public var readerSeed: ReaderSeed {
        ReaderSeed(wrappingKey: wrappingKey, attributeKey: attributeKey, blindIndexKey: blindIndexKey, auditKey: auditKey,
                   generationKey: generationKey, searchKey: searchKey, fileIdentities: fileIdentities,
                   stateDirectory: stateDirectory, passwordHashing: passwordHashing)
    }

    /// A read-only store over `db`, another connection to the writer's file, with its keys.
    convenience init(reader seed: ReaderSeed, db: Database) {
        self.init(db: db, isReader: true, seed)
    }

    private init(db: Database, isReader: Bool, _ seed: ReaderSeed) {
        self.db = db
        self.isReader = isReader
        self.wrappingKey = seed.wrappingKey
        self.attributeKey = seed.attributeKey
        self.blindIndexKey = seed.blindIndexKey
        self.auditKey = seed.auditKey
        self.generationKey = seed.generationKey
        self.searchKey = seed.searchKey
        self.fileIdentities = seed.fileIdentities
        self.stateDirectory = seed.stateDirectory
        self.passwordHashing = seed.passwordHashing
    }

    /// Opens (or, on first start, creates) the vault in `stateDirectory`.
    ///
    /// The directory is created 0700 if missing and refused if it is accessible to group or
    /// others or not owned by the euid. The key file is created with O_EXCL at first start and
    /// refused if accessible to others, of the wrong size, or unreadable; an existing file is
    /// never overwritten, and no new key is made for an existing vault. A database file that is
    /// not SQLite, or SQLite but not Keyhold's, is `.notAKeyholdDatabase` and is left untouched.
    ///
    /// - Parameter passwordHashing: Argon2id limits for new app-password items. Keep the default;
    ///   `.interactive` exists for tests.
    /// - Parameter keyProtector: how the vault key is kept at rest (`vault.key` by default).
    public static func open(stateDirectory: String, passwordHashing: PasswordHashStrength = .moderate,
                            keyProtector: any VaultKeyProtector = FileKeyProtector()) throws(StoreError) -> VaultStore {
        Sodium.ready()
        try StateDirectory.prepare(stateDirectory)
        let keyPath = stateDirectory + "/" + keyProtector.kind.fileName
        let dbPath = stateDirectory + "/" + StateDirectory.databaseFileName

        // Identify an existing database before touching the key file or writing anything.
        let db: Database
        let fileIdentity: StateDirectory.FileIdentity
        var existingVersion: Int64 = 0
        if try StateDirectory.exists(dbPath) {
            try StateDirectory.checkExistingFile(dbPath)
            (db, fileIdentity) = try StateDirectory.openDatabase(dbPath)
            existingVersion = try identify(db)
        } else {
            // An orphan key file without a database is fine (a first start that stopped early).
            try StateDirectory.createPrivateFile(dbPath, directory: stateDirectory)
            (db, fileIdentity) = try StateDirectory.openDatabase(dbPath)
        }

        let key: VaultKey
        if try StateDirectory.exists(keyPath) {
            key = try keyProtector.load(path: keyPath)
        } else {
            // A vault without its key cannot be recovered by making a new one.
            guard existingVersion == 0 else { throw .keyFileInvalid }
            if keyProtector.kind == .file {
                key = try StateDirectory.createKey(keyPath, directory: stateDirectory)
            } else {
                key = VaultKey.generate()
                try KeyFiles.replace(keyPath, with: try keyProtector.protect(key), directory: stateDirectory)
            }
        }

        let store = VaultStore(db: db, key: key, stateDirectory: stateDirectory, passwordHashing: passwordHashing)
        try store.configure()
        try store.migrate(from: existingVersion)
        try store.checkOrRecordKey(key)
        if existingVersion < 2 { try store.initialiseGenerationHead() }
        try store.backfillSearchIndex()
        // None when they cannot be named: then no reader opens, and the broker looks up on the writer.
        store.fileIdentities = (try? StateDirectory.openedFiles(db, at: dbPath, opened: fileIdentity)) ?? []
        return store
    }

    /// 0 for a fresh (empty) file, else the Keyhold schema version; throws for anything else.
    private static func identify(_ db: Database) throws(StoreError) -> Int64 {
        let tables: Int64
        let version: Int64
        do {
            tables = try db.withStatement("SELECT count(*) FROM sqlite_master") { (s) throws(DatabaseError) in
                try s.step() ? s.int64(0) : 0
            }
            version = try db.withStatement("PRAGMA user_version") { (s) throws(DatabaseError) in
                try s.step() ? s.int64(0) : 0
            }
        } catch {
            throw error.isNotADatabase || error.primaryCode == 11 /* SQLITE_CORRUPT */ ? .notAKeyholdDatabase : .io(code: error.code)
        }
        if tables == 0 && version == 0 { return 0 }
        let format: String?
        do {
            format = try db.withStatement("SELECT value FROM vault_meta WHERE name = 'format'") { (s) throws(DatabaseError) in
                try s.step() ? s.text(0) : nil
            }
        } catch {
            throw .notAKeyholdDatabase  // no vault_meta table: someone else's database
        }
        guard format == formatName, version >= 1 else { throw .notAKeyholdDatabase }
        guard version <= Schema.knownVersion else { throw .unsupportedVersion(found: version, known: Schema.knownVersion) }
        return version
    }

    private func configure() throws(StoreError) {
        let mode: String?
        do {
            mode = try db.pragma("journal_mode=WAL")
            // FULL: a returned commit has been fsynced (WAL), so it survives kill -9 and power loss.
            try db.execute("PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON; PRAGMA secure_delete=ON;")
        } catch { throw StoreError.from(error) }
        // WAL cannot be refused for a local file; if it is, durability assumptions do not hold.
        guard mode == "wal" else { throw .io(code: EINVAL) }
    }

    private func migrate(from version: Int64) throws(StoreError) {
        for m in Schema.migrations where m.version > version {
            do {
                try db.transaction { () throws(DatabaseError) in
                    try db.execute(m.sql)
                    try db.execute("PRAGMA user_version = \(m.version)")
                }
            } catch { throw StoreError.from(error) }
        }
    }

    /// A fresh vault records a check value of its key and the empty audit head; an existing
    /// one must match the key file.
    private func checkOrRecordKey(_ key: VaultKey) throws(StoreError) {
        let expected = KeyedHash.hash(Array("keyhold key check v1".utf8), key: key.keyCheckKey)
        do {
            let stored = try db.withStatement("SELECT value FROM vault_meta WHERE name = 'key_check'") { (s) throws(DatabaseError) in
                try s.step() ? s.blob(0) : nil
            }
            if let stored {
                guard KeyedHash.equal(stored, expected) else { throw StoreError.keyFileInvalid }
                return
            }
            try db.transaction { () throws(DatabaseError) in
                try db.withStatement("INSERT INTO vault_meta (name, value) VALUES ('key_check', ?1)") { (s) throws(DatabaseError) in
                    try s.bind(1, blob: expected)
                    try s.step()
                }
                let hasRows = try db.withStatement("SELECT EXISTS (SELECT 1 FROM audit)") { (s) throws(DatabaseError) in
                    try s.step() && s.int64(0) != 0
                }
                if !hasRows { try writeHead(seq: 0, mac: genesisMAC) }
            }
        } catch let e as DatabaseError {
            throw StoreError.from(e)
        } catch {
            throw error as! StoreError
        }
    }

    /// Closes the database. Later calls fail with `.closed` (or `.io`).
    public func close() { db.close() }

    deinit { db.close() }
}
