import Glibc
import KeyholdCore

/// The encrypted item store of one vault: a state directory holding `vault.key` (0600) and
/// `vault.db` (SQLite, WAL, synchronous=FULL).
///
/// Not Sendable and not thread-safe: the broker serialises every call behind one lock.
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
    /// Parsed policy texts and executable lists, so listing many items parses each distinct
    /// value once. Bounded; only values that parsed are kept.
    var policyCache: [String: Policy] = [:]
    var executablesCache: [[UInt8]: [String]] = [:]

    /// The schema version this code writes (the last `-- migrate:N` of schema.sql).
    public static var schemaVersion: Int64 { Schema.knownVersion }
    static let formatName = "keyhold-vault"

    private init(db: Database, key: VaultKey, stateDirectory: String, passwordHashing: PasswordHashStrength) {
        self.db = db
        self.wrappingKey = key.wrappingKey
        self.attributeKey = key.attributeKey
        self.blindIndexKey = key.blindIndexKey
        self.auditKey = key.auditKey
        self.generationKey = key.generationKey
        self.searchKey = key.searchKey
        self.stateDirectory = stateDirectory
        self.passwordHashing = passwordHashing
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
        var existingVersion: Int64 = 0
        if try StateDirectory.exists(dbPath) {
            try StateDirectory.checkExistingFile(dbPath)
            do { db = try Database(path: dbPath) } catch { throw StoreError.from(error) }
            existingVersion = try identify(db)
        } else {
            // An orphan key file without a database is fine (a first start that stopped early).
            try StateDirectory.createPrivateFile(dbPath, directory: stateDirectory)
            do { db = try Database(path: dbPath) } catch { throw StoreError.from(error) }
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

    // MARK: Items

    /// The item of `owner` with these names, or nil. A row that does not open, or whose
    /// names or owner differ from the request, is `.integrity`: never another item.
    public func item(owner: UInt32, service: String, account: String) throws(StoreError) -> StoredItem? {
        guard service.utf8.count <= Limits.maxTextBytes, account.utf8.count <= Limits.maxTextBytes else { throw .tooLarge }
        let lookup = BlindIndex(key: blindIndexKey, owner: owner, service: service, account: account)
        let row: ItemRow?
        do {
            row = try db.withStatement("SELECT \(Self.itemColumns) FROM items WHERE lookup = ?1") { (s) throws(DatabaseError) in
                try s.bind(1, blob: lookup.bytes)
                return try s.step() ? ItemRow(s) : nil
            }
        } catch { throw StoreError.from(error) }
        guard let row else { return nil }
        let item = try decode(row, generations: try verifiedGenerations())
        guard item.owner == owner, item.service == service, item.account == account else { throw .integrity }
        return item
    }

    /// Every item of `owner` (metadata only), in creation order (rowid: `replace` keeps it), and how many of the owner's
    /// rows failed to open (damaged or altered; they are left out). One query, no per-row prepare.
    public func items(owner: UInt32) throws(StoreError) -> (items: [StoredItem], damaged: Int) {
        var all: [StoredItem] = []
        var damaged = 0
        var cursor: ItemPageCursor?
        repeat {
            let page = try items(owner: owner, after: cursor, limit: 10_000)
            all += page.items
            damaged += page.damaged
            cursor = page.next
        } while cursor != nil
        return (all, damaged)
    }

    /// Where the next page of a listing starts (opaque to callers).
    public struct ItemPageCursor: Sendable, Equatable {
        let rowid: Int64
    }

    /// One page of the owner's items in storage order, and the cursor of the next page (nil
    /// at the end). Paging lets the broker send a long listing while it reads the rest, and
    /// release the store between pages so other callers are not held up.
    public func items(owner: UInt32, after cursor: ItemPageCursor?, limit: Int) throws(StoreError)
        -> (items: [StoredItem], damaged: Int, next: ItemPageCursor?) {
        var items: [StoredItem] = []
        var damaged = 0
        var last: Int64?
        var rows = 0
        // A record that does not verify vouches for no row: each counts as damaged.
        var generations: GenerationRecord?
        do { generations = try verifiedGenerations() } catch {
            guard error == .integrity else { throw error }
        }
        do {
            try db.withStatement("""
                SELECT \(Self.itemColumns), rowid FROM items WHERE owner_uid = ?1 AND rowid > ?2 ORDER BY rowid LIMIT ?3
                """) { (s) throws(DatabaseError) in
                try s.bind(1, Int64(owner))
                try s.bind(2, cursor?.rowid ?? Int64.min)
                try s.bind(3, Int64(max(limit, 1)))
                while try s.step() {
                    rows += 1
                    last = s.int64(14)
                    if let generations, let item = try? decode(ItemRow(s), generations: generations, checkLookup: false),
                       item.owner == owner { items.append(item) } else { damaged += 1 }
                }
            }
        } catch { throw StoreError.from(error) }
        let next = rows >= max(limit, 1) ? last.map { ItemPageCursor(rowid: $0) } : nil
        return (items, damaged, next)
    }

    func checkAuditSize(_ audit: AuditRecord) throws(StoreError) {
        for text in [audit.executable, audit.service ?? "", audit.account ?? "", audit.reason ?? ""] {
            guard text.utf8.count <= Limits.maxTextBytes else { throw .tooLarge }
        }
    }

    /// Adds an item of `owner` at generation 1; `.duplicate` if one with the same names
    /// exists. `audit` is written in the same transaction; its item id is filled in when nil.
    @discardableResult
    public func add(owner: UInt32, _ item: NewItem, secret: SecureBytes, appPassword: AppPasswordKey? = nil,
                    audit: AuditRecord) throws(StoreError) -> StoredItem {
        try validate(item, secret: secret, appPassword: appPassword)
        try checkAuditSize(audit)
        let record = try verifiedGenerations()
        let id = ItemID.random()
        let generation: UInt64 = 1
        let now = currentMicroseconds()
        let sealed = try seal(id: id, owner: owner, generation: generation, item, secret: secret, appPassword: appPassword)
        var audit = audit
        if audit.itemID == nil { audit.itemID = id }
        let digest = try changingGenerations { () throws(StoreError) -> [UInt8] in
            do throws(DatabaseError) {
                try db.withStatement("""
                    INSERT INTO items (id, owner_uid, lookup, kind, policy, allowed_executables, reuse_seconds,
                        biometry_state, pwhash_params, attributes, wrapped_key, secret, created_us, updated_us, generation, expires_us)
                    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?13, ?14, ?16)
                    """) { (s) throws(DatabaseError) in
                    try bindItem(s, id: id, owner: owner, item, sealed)
                    try s.bind(13, now)
                    try s.bind(14, Int64(generation))
                    try s.step()
                }
            } catch {
                throw error.isUniqueViolation ? .duplicate : StoreError.from(error)
            }
            try mapped { () throws(DatabaseError) in try writeSearchTags(id, owner: owner, item.service, item.account) }
            let digest = try mapped { () throws(DatabaseError) in
                try setGeneration(id, from: record.generations[id], to: generation, digest: record.digest)
            }
            try writeAudit(audit, generationDigest: digest)
            return digest
        }
        commitGeneration(id, generation, digest: digest, record: record)
        return StoredItem(id: id, owner: owner, service: item.service, account: item.account, label: item.label,
                          kind: item.kind, access: item.access, biometryState: item.biometryState, createdAt: now,
                          updatedAt: now, passwordHashing: sealed.passwordHashing, generation: generation,
                          expires: item.expires)
    }

    /// A store transaction that changes the generation record. The in-memory record is updated
    /// only after it commits (`commitGeneration`), so a rollback leaves both as they were; it is
    /// not dropped on failure, which would let a flood of failing requests (duplicates) force a
    /// re-read of the whole record each time.
    private func changingGenerations<R>(_ body: () throws(StoreError) -> R) throws(StoreError) -> R {
        try db.transaction(mapError: StoreError.from, commitError: { _ in .auditWriteFailed }, body)
    }

    private func mapped<R>(_ body: () throws(DatabaseError) -> R) throws(StoreError) -> R {
        do { return try body() } catch { throw StoreError.from(error) }
    }

    /// After an UPDATE/DELETE guarded by the generation touched no row: `.conflict` if the
    /// item is still there (changed since it was read), `.notFound` if it is gone.
    private func missedChange(_ item: StoredItem) throws(StoreError) -> StoreError {
        try mapped { () throws(DatabaseError) in try storedGeneration(id: item.id, owner: item.owner) } == nil ? .notFound : .conflict
    }

    /// Replaces an item's secret, names and access in place (same id, same creation time),
    /// under a fresh item key, at the next generation. `.notFound` if it is gone, `.conflict`
    /// if it changed since `existing` was read, `.duplicate` if renamed onto another.
    @discardableResult
    public func replace(_ existing: StoredItem, with item: NewItem, secret: SecureBytes, appPassword: AppPasswordKey? = nil,
                        audit: AuditRecord) throws(StoreError) -> StoredItem {
        try validate(item, secret: secret, appPassword: appPassword)
        try checkAuditSize(audit)
        let record = try verifiedGenerations()
        guard record.generations[existing.id] == existing.generation else {
            throw record.generations[existing.id] == nil ? .notFound : .conflict
        }
        let generation = existing.generation + 1
        let now = currentMicroseconds()
        let sealed = try seal(id: existing.id, owner: existing.owner, generation: generation, item, secret: secret,
                              appPassword: appPassword)
        var audit = audit
        if audit.itemID == nil { audit.itemID = existing.id }
        let digest = try changingGenerations { () throws(StoreError) -> [UInt8] in
            let changed: Int
            do throws(DatabaseError) {
                changed = try db.withStatement("""
                    UPDATE items SET lookup = ?3, kind = ?4, policy = ?5, allowed_executables = ?6, reuse_seconds = ?7,
                        biometry_state = ?8, pwhash_params = ?9, attributes = ?10, wrapped_key = ?11, secret = ?12,
                        updated_us = ?13, generation = ?14, expires_us = ?16
                    WHERE id = ?1 AND owner_uid = ?2 AND generation = ?15
                    """) { (s) throws(DatabaseError) in
                    try bindItem(s, id: existing.id, owner: existing.owner, item, sealed)
                    try s.bind(13, now)
                    try s.bind(14, Int64(generation))
                    try s.bind(15, Int64(existing.generation))
                    try s.step()
                    return db.changes
                }
            } catch {
                throw error.isUniqueViolation ? .duplicate : StoreError.from(error)
            }
            guard changed == 1 else { throw try missedChange(existing) }
            try mapped { () throws(DatabaseError) in
                try writeSearchTags(existing.id, owner: existing.owner, item.service, item.account)
            }
            let digest = try mapped { () throws(DatabaseError) in
                try setGeneration(existing.id, from: existing.generation, to: generation, digest: record.digest)
            }
            try writeAudit(audit, generationDigest: digest)
            return digest
        }
        commitGeneration(existing.id, generation, digest: digest, record: record)
        return StoredItem(id: existing.id, owner: existing.owner, service: item.service, account: item.account,
                          label: item.label, kind: item.kind, access: item.access, biometryState: item.biometryState,
                          createdAt: existing.createdAt, updatedAt: now, passwordHashing: sealed.passwordHashing,
                          generation: generation, expires: item.expires)
    }

    /// Deletes an item (secure_delete overwrites its pages) and its generation, so its row
    /// cannot be put back. `.notFound` if it is gone, `.conflict` if it changed since read.
    public func delete(_ item: StoredItem, audit: AuditRecord) throws(StoreError) {
        try checkAuditSize(audit)
        let record = try verifiedGenerations()
        var audit = audit
        if audit.itemID == nil { audit.itemID = item.id }
        let digest = try changingGenerations { () throws(StoreError) -> [UInt8] in
            let changed: Int
            do throws(DatabaseError) {
                changed = try db.withStatement("DELETE FROM items WHERE id = ?1 AND owner_uid = ?2 AND generation = ?3") { (s) throws(DatabaseError) in
                    try s.bind(1, blob: item.id.bytes)
                    try s.bind(2, Int64(item.owner))
                    try s.bind(3, Int64(item.generation))
                    try s.step()
                    return db.changes
                }
            } catch { throw StoreError.from(error) }
            guard changed == 1 else { throw try missedChange(item) }
            try mapped { () throws(DatabaseError) in try removeSearchTags(item.id) }
            let digest = try mapped { () throws(DatabaseError) in
                try setGeneration(item.id, from: record.generations[item.id], to: nil, digest: record.digest)
            }
            try writeAudit(audit, generationDigest: digest)
            return digest
        }
        commitGeneration(item.id, nil, digest: digest, record: record)
    }

    /// Removes the row the caller's blind index points to when that row no longer opens (its
    /// boxes were altered, or it is an older copy), so a damaged item can be cleared and stored
    /// again. Only a row whose lookup and owner both match the caller is touched; `.notFound`
    /// otherwise. The broker asks for the owner's password first (issue 8, item 5). When the
    /// generation record itself does not verify, the row goes and the record stays unverified.
    public func deleteDamaged(owner: UInt32, service: String, account: String, audit: AuditRecord) throws(StoreError) {
        try checkAuditSize(audit)
        let lookup = BlindIndex(key: blindIndexKey, owner: owner, service: service, account: account)
        var record: GenerationRecord?
        do { record = try verifiedGenerations() } catch {
            guard error == .integrity else { throw error }
        }
        var removedID: ItemID?
        let digest = try changingGenerations { () throws(StoreError) -> [UInt8]? in
            var audit = audit
            let raw: [UInt8]?
            do throws(DatabaseError) {
                raw = try db.withStatement("SELECT id FROM items WHERE lookup = ?1 AND owner_uid = ?2") { (s) throws(DatabaseError) in
                    try s.bind(1, blob: lookup.bytes)
                    try s.bind(2, Int64(owner))
                    return try s.step() ? s.blob(0) : nil
                }
                if raw != nil {
                    try db.withStatement("DELETE FROM items WHERE lookup = ?1 AND owner_uid = ?2") { (s) throws(DatabaseError) in
                        try s.bind(1, blob: lookup.bytes)
                        try s.bind(2, Int64(owner))
                        try s.step()
                    }
                }
            } catch { throw StoreError.from(error) }
            guard let raw else { throw StoreError.notFound }
            try mapped { () throws(DatabaseError) in try removeSearchTags(raw) }
            removedID = ItemID(bytes: raw)
            var digest: [UInt8]?
            if let id = removedID {
                if audit.itemID == nil { audit.itemID = id }
                // The id is the row's own (possibly altered) one: only an entry the record
                // vouches for is removed from it.
                if let record, let current = record.generations[id] {
                    digest = try mapped { () throws(DatabaseError) in
                        try setGeneration(id, from: current, to: nil, digest: record.digest)
                    }
                }
            }
            try writeAudit(audit, generationDigest: digest)
            return digest
        }
        if let record, let id = removedID, let digest { commitGeneration(id, nil, digest: digest, record: record) }
    }

    /// Opens the item's secret into guarded memory. The row is read again, so a deleted item
    /// is `.notFound` and a replaced one opens its current secret. `.integrity` if any box
    /// fails under the vault key or the row is not the item's current generation;
    /// `.appPasswordRequired` / `.appPasswordWrong` for app-password items, `.conflict` when
    /// the application-password key was made for parameters the item no longer has.
    public func openSecret(_ item: StoredItem, appPassword: AppPasswordKey? = nil) throws(StoreError) -> SecureBytes {
        let fetched: (ItemRow, [UInt8], [UInt8])?
        do {
            fetched = try db.withStatement("SELECT \(Self.itemColumns), wrapped_key, secret FROM items WHERE id = ?1") { (s) throws(DatabaseError) in
                try s.bind(1, blob: item.id.bytes)
                return try s.step() ? (ItemRow(s), s.blob(14), s.blob(15)) : nil
            }
        } catch { throw StoreError.from(error) }
        guard let (row, wrappedRaw, secretRaw) = fetched else { throw .notFound }
        let current = try decode(row, generations: try verifiedGenerations())
        guard current.owner == item.owner, current.service == item.service, current.account == item.account else {
            throw .integrity
        }
        let ad = current.associatedData
        let unwrapped: SecureBytes
        do {
            unwrapped = try SealedBox(combined: wrappedRaw).open(using: wrappingKey, authenticating: ad.encoded(for: .wrappedKey))
        } catch { throw .integrity }
        let itemKeyBytes: SecureBytes
        if let params = current.passwordHashing {
            guard let appPassword else { throw .appPasswordRequired }
            // Made for other parameters: the item was sealed again since (another password or
            // salt), so this key cannot be judged right or wrong. Ask again.
            guard appPassword.parameters == params else { throw .conflict }
            // The outer box authenticated these bytes, so a failure below is the password's.
            let inner: SealedBox
            do { inner = try SealedBox(combined: unwrapped.withUnsafeBytes { Array($0) }) } catch { throw .integrity }
            do {
                itemKeyBytes = try inner.open(using: appPassword.key, authenticating: ad.encoded(for: .passwordWrappedKey))
            } catch { throw .appPasswordWrong }
        } else {
            itemKeyBytes = unwrapped
        }
        let itemKey: ItemKey
        do { itemKey = try ItemKey(unwrapped: itemKeyBytes) } catch { throw .integrity }
        do {
            return try SealedBox(combined: secretRaw).open(using: itemKey, authenticating: ad.encoded(for: .secret))
        } catch { throw .integrity }
    }

    // MARK: Lockout

    /// The uid's lockout record; a zero record if there is none.
    public func lockout(uid: UInt32) throws(StoreError) -> LockoutRecord {
        do {
            return try db.withStatement("SELECT failures, level, locked_until_us FROM lockout WHERE uid = ?1") { (s) throws(DatabaseError) in
                try s.bind(1, Int64(uid))
                guard try s.step() else { return LockoutRecord(uid: uid) }
                return LockoutRecord(uid: uid, failures: UInt32(clamping: s.int64(0)), level: UInt32(clamping: s.int64(1)),
                                     lockedUntil: s.int64(2))
            }
        } catch { throw StoreError.from(error) }
    }

    /// Stores the uid's lockout record durably.
    public func setLockout(_ record: LockoutRecord) throws(StoreError) {
        do {
            try db.withStatement("""
                INSERT INTO lockout (uid, failures, level, locked_until_us) VALUES (?1, ?2, ?3, ?4)
                ON CONFLICT (uid) DO UPDATE SET failures = excluded.failures, level = excluded.level,
                    locked_until_us = excluded.locked_until_us
                """) { (s) throws(DatabaseError) in
                try s.bind(1, Int64(record.uid))
                try s.bind(2, Int64(record.failures))
                try s.bind(3, Int64(record.level))
                try s.bind(4, record.lockedUntil)
                try s.step()
            }
        } catch { throw StoreError.from(error) }
    }

    // MARK: Audit

    /// Appends one audit entry, committed durably on return. Any failure is `.auditWriteFailed`.
    public func append(_ audit: AuditRecord) throws(StoreError) {
        try checkAuditSize(audit)
        try db.transaction(mapError: { _ in StoreError.auditWriteFailed }) { () throws(StoreError) in
            try writeAudit(audit)
        }
    }
}
