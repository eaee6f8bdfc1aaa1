import Glibc
import KeyholdCore

/// Items: lookup, listing, add, replace, delete and opening a secret. Each write lands with its
/// audit entry in one transaction.
extension VaultStore {
    /// The item of `owner` with these names, or nil. A row that does not open, or whose
    /// names or owner differ from the request, is `.integrity`: never another item.
    public func item(owner: UInt32, service: String, account: String) throws(StoreError) -> StoredItem? {
        guard service.utf8.count <= Limits.maxTextBytes, account.utf8.count <= Limits.maxTextBytes else { throw .tooLarge }
        let lookup = BlindIndex(key: blindIndexKey, owner: owner, service: service, account: account)
        guard let (row, _, _) = try sealedRow(lookup: lookup.bytes) else { return nil }
        let item = try decode(row, generations: try verifiedGenerations())
        guard item.owner == owner, item.service == service, item.account == account else { throw .integrity }
        return item
    }

    /// Where the next page of a listing starts (opaque to callers).
    public struct ItemPageCursor: Sendable, Equatable {
        let rowid: Int64
    }

    /// A page of a listing or search: the items that opened, how many rows did not (damaged or
    /// altered; left out), and where the next page starts (nil at the end).
    public typealias ItemPage = (items: [StoredItem], damaged: Int, next: ItemPageCursor?)

    /// One page of the owner's items (metadata only) in creation order (rowid: `replace` keeps
    /// it), the number of the page's rows that failed to open (damaged or altered; left out),
    /// and the cursor of the next page (nil at the end). Paging lets the broker send a long
    /// listing while it reads the rest, and let go of its reader between pages.
    public func items(owner: UInt32, after cursor: ItemPageCursor?, limit: Int) throws(StoreError) -> ItemPage {
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
                    last = s.int64(Self.columnAfterItem)
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

    /// A database call whose error becomes the store's (shared by the store's extensions).
    func mapped<R>(_ body: () throws(DatabaseError) -> R) throws(StoreError) -> R {
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
    /// is `.notFound` and a replaced one opens its current secret — only if it still carries
    /// the access control `item` had (policy, allowed executables, reuse, biometry binding,
    /// application-password parameters): the caller's decision was made on `item`, so a row
    /// changed since (a policy tightened between the lookup and this read) is `.conflict`,
    /// never released under the older decision. `.integrity` if any box fails under the vault
    /// key or the row is not the item's current generation; `.appPasswordRequired` /
    /// `.appPasswordWrong` for app-password items, `.conflict` when the application-password
    /// key was made for parameters the item no longer has.
    public func openSecret(_ item: StoredItem, appPassword: AppPasswordKey? = nil) throws(StoreError) -> SecureBytes {
        try openCurrentSecret(item, appPassword: appPassword).secret
    }

    /// `openSecret`, with the row it opened (its generation and expiry are what was released).
    public func openCurrentSecret(_ item: StoredItem, appPassword: AppPasswordKey? = nil) throws(StoreError)
        -> (secret: SecureBytes, current: StoredItem) {
        guard let (row, wrappedKey, sealedSecret) = try sealedRow(id: item.id) else { throw .notFound }
        let current = try decode(row, generations: try verifiedGenerations())
        guard current.owner == item.owner, current.service == item.service, current.account == item.account else {
            throw .integrity
        }
        guard current.access == item.access, current.biometryState == item.biometryState,
              current.passwordHashing == item.passwordHashing, current.generation >= item.generation else { throw .conflict }
        return (try Self.openSealed(current, wrappedKey: wrappedKey, sealedSecret: sealedSecret, wrappingKey: wrappingKey,
                                    appPassword: appPassword), current)
    }

    /// The row of item `id` with its sealed key and secret, as stored; nil when there is none.
    func sealedRow(id: ItemID) throws(StoreError) -> (ItemRow, [UInt8], [UInt8])? {
        try sealedRow(Self.sealedRowByID, is: id.bytes)
    }

    /// The row whose blind index is `lookup`, as `sealedRow(id:)`.
    func sealedRow(lookup: [UInt8]) throws(StoreError) -> (ItemRow, [UInt8], [UInt8])? {
        try sealedRow(Self.sealedRowByLookup, is: lookup)
    }

    /// The statements of `sealedRow`, built once (the statement cache is keyed by their text).
    static let sealedRowByID = "SELECT \(itemColumns), wrapped_key, secret FROM items WHERE id = ?1"
    static let sealedRowByLookup = "SELECT \(itemColumns), wrapped_key, secret FROM items WHERE lookup = ?1"

    /// The one row that `query` (`sealedRowByID` or `sealedRowByLookup`: a unique column) finds
    /// for `key`, with its sealed key and secret, as stored; nil when there is none.
    private func sealedRow(_ query: String, is key: [UInt8]) throws(StoreError) -> (ItemRow, [UInt8], [UInt8])? {
        do {
            return try db.withStatement(query) { (s) throws(DatabaseError) in
                try s.bind(1, blob: key)
                return try s.step() ? (ItemRow(s), s.blob(Self.columnAfterItem), s.blob(Self.columnAfterItem + 1)) : nil
            }
        } catch { throw StoreError.from(error) }
    }

    /// Opens the secret of `item` (decoded from the row these boxes came from) with the vault
    /// key: `.integrity` if a box fails under it; for app-password items `.appPasswordRequired`,
    /// `.appPasswordWrong`, or `.conflict` when the key was made for other parameters.
    static func openSealed(_ item: StoredItem, wrappedKey: [UInt8], sealedSecret: [UInt8], wrappingKey: WrappingKey,
                           appPassword: AppPasswordKey?) throws(StoreError) -> SecureBytes {
        let ad = item.associatedData
        let unwrapped: SecureBytes
        do {
            unwrapped = try SealedBox(combined: wrappedKey).open(using: wrappingKey, authenticating: ad.encoded(for: .wrappedKey))
        } catch { throw .integrity }
        let itemKeyBytes: SecureBytes
        if let params = item.passwordHashing {
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
            return try SealedBox(combined: sealedSecret).open(using: itemKey, authenticating: ad.encoded(for: .secret))
        } catch { throw .integrity }
    }
}
