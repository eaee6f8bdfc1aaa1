import KeyholdCore

/// The attribute-pair search index (`item_search`, schema migration 4).
///
/// Each item has one row per pair of its attribute map (`AttributeMap`, from its sealed
/// service and account): tag = keyed BLAKE2b of (owner, key, value) under its own subkey. A
/// search looks up the tags of the query's pairs, then opens every candidate row and matches
/// its sealed map exactly under the caller's uid, so the index only ever narrows: a forged,
/// moved or deleted tag row can hide an item from a search, never return a wrong one.
extension VaultStore {
    /// vault_meta name set in the transaction that wrote the rows of the items older than the index.
    static let searchIndexMarker = "search_index"

    func searchTag(owner: UInt32, key: String, value: String) -> [UInt8] {
        var e = CanonicalEncoder(domain: "keyhold search tag v1")
        e.append(owner)
        e.append(key)
        e.append(value)
        return KeyedHash.hash(e.bytes, key: searchKey)
    }

    /// Replaces the item's rows with the tags of its names' map, inside the caller's transaction.
    func writeSearchTags(_ id: ItemID, owner: UInt32, _ service: String, _ account: String) throws(DatabaseError) {
        try removeSearchTags(id.bytes)
        for (key, value) in AttributeMap.attributes(service: service, account: account) {
            try db.withStatement("INSERT INTO item_search (item_id, tag) VALUES (?1, ?2)") { (s) throws(DatabaseError) in
                try s.bind(1, blob: id.bytes)
                try s.bind(2, blob: searchTag(owner: owner, key: key, value: value))
                try s.step()
            }
        }
    }

    func removeSearchTags(_ id: ItemID) throws(DatabaseError) { try removeSearchTags(id.bytes) }

    func removeSearchTags(_ rawID: [UInt8]) throws(DatabaseError) {
        try db.withStatement("DELETE FROM item_search WHERE item_id = ?1") { (s) throws(DatabaseError) in
            try s.bind(1, blob: rawID)
            try s.step()
        }
    }

    /// One page of the items of `owner` whose attribute map holds every pair of `query`, in
    /// creation order, from after `cursor`; how many candidate rows failed to open (damaged; left
    /// out); and the cursor of the next page (nil at the end). An empty query is every item of
    /// the owner. Each page reads at most `limit` rows, so the broker can let go of its reader
    /// between pages whatever the query matches. A query with a rare pair is driven by that pair's index
    /// rows (one short page); one whose every pair is common walks the owner's items in order,
    /// checking each pair on the (item_id, tag) index. Each candidate is opened and matched
    /// exactly, and must be the owner's (its owner is bound into its boxes).
    public func search(owner: UInt32, attributes query: [String: String], after cursor: ItemPageCursor?, limit: Int) throws(StoreError)
        -> ItemPage {
        guard query.count <= Limits.maxAttributePairs else { throw .tooLarge }
        for (k, v) in query where k.utf8.count > Limits.maxTextBytes || v.utf8.count > Limits.maxTextBytes { throw .tooLarge }
        if query.isEmpty { return try items(owner: owner, after: cursor, limit: limit) }
        var generations: GenerationRecord?
        do { generations = try verifiedGenerations() } catch {
            guard error == .integrity else { throw error }
        }
        let (tags, rare) = try mapped { () throws(DatabaseError) in
            try drivingOrder(query.map { searchTag(owner: owner, key: $0.key, value: $0.value) })
        }
        let first = 4
        func has(_ i: Int, _ item: String) -> String {
            "EXISTS (SELECT 1 FROM item_search t WHERE t.item_id = \(item) AND t.tag = ?\(i + first))"
        }
        // The last column is 1 for a row whose index rows hold every pair of the query.
        let sql = rare
            ? """
              SELECT \(Self.itemColumns), rowid, 1 FROM items WHERE owner_uid = ?1 AND rowid > ?2 AND id IN (
                  SELECT s.item_id FROM item_search s WHERE s.tag = ?\(first) \(tags.indices.dropFirst().map { "AND " + has($0, "s.item_id") }.joined(separator: " ")))
              ORDER BY rowid LIMIT ?3
              """
            : """
              SELECT \(Self.itemColumns), rowid, \(tags.indices.map { has($0, "items.id") }.joined(separator: " AND "))
              FROM items WHERE owner_uid = ?1 AND rowid > ?2 ORDER BY rowid LIMIT ?3
              """
        var found: [StoredItem] = []
        var damaged = 0, rows = 0
        var last: Int64?
        try mapped { () throws(DatabaseError) in
            try db.withStatement(sql) { (s) throws(DatabaseError) in
                try s.bind(1, Int64(owner))
                try s.bind(2, cursor?.rowid ?? Int64.min)
                try s.bind(3, Int64(max(limit, 1)))
                for (i, tag) in tags.enumerated() { try s.bind(Int32(i + first), blob: tag) }
                while try s.step() {
                    rows += 1
                    last = s.int64(Self.columnAfterItem)
                    guard s.int64(Self.columnAfterItem + 1) == 1 else { continue }
                    guard let generations, let item = try? decode(ItemRow(s), generations: generations, checkLookup: false),
                          item.owner == owner else {
                        damaged += 1
                        continue
                    }
                    // The index only proposes: a row whose sealed map does not match is not an answer.
                    if AttributeMap.matches(AttributeMap.attributes(service: item.service, account: item.account), query) {
                        found.append(item)
                    }
                }
            }
        }
        let next = rows >= max(limit, 1) ? last.map { ItemPageCursor(rowid: $0) } : nil
        return (found, damaged, next)
    }

    /// The tags, rarest first (rows counted up to a cap), and whether the rarest has fewer rows
    /// than the cap: then a search walks its rows, else the owner's items.
    private func drivingOrder(_ tags: [[UInt8]]) throws(DatabaseError) -> (tags: [[UInt8]], rare: Bool) {
        let cap: Int64 = 256
        var counted: [(tag: [UInt8], rows: Int64)] = []
        for tag in tags {
            let n = try db.withStatement("SELECT count(*) FROM (SELECT 1 FROM item_search WHERE tag = ?1 LIMIT \(cap))") { (s) throws(DatabaseError) in
                try s.bind(1, blob: tag)
                return try s.step() ? s.int64(0) : 0
            }
            counted.append((tag, n))
        }
        counted.sort { $0.rows < $1.rows }
        return (counted.map(\.tag), counted[0].rows < cap)
    }

    /// Items written before migration 4 get their rows once, on the first open after it (the
    /// vault key is needed to read their names), in one transaction with the vault_meta marker.
    /// Idempotent: it rewrites the whole index. Items that do not open get no rows (they are
    /// damaged; `ls` counts them). Left for the next open while the generation record does not
    /// verify (then no item opens).
    func backfillSearchIndex() throws(StoreError) {
        let done = try mapped { () throws(DatabaseError) in
            try db.withStatement("SELECT 1 FROM vault_meta WHERE name = ?1") { (s) throws(DatabaseError) in
                try s.bind(1, text: Self.searchIndexMarker)
                return try s.step()
            }
        }
        if done { return }
        let generations: GenerationRecord
        do { generations = try verifiedGenerations() } catch {
            if error == .integrity { return }
            throw error
        }
        try mapped { () throws(DatabaseError) in
            try db.transaction { () throws(DatabaseError) in
                var names: [(ItemID, UInt32, String, String)] = []
                try db.withStatement("SELECT \(Self.itemColumns) FROM items ORDER BY rowid") { (s) throws(DatabaseError) in
                    while try s.step() {
                        if let item = try? decode(ItemRow(s), generations: generations, checkLookup: false) {
                            names.append((item.id, item.owner, item.service, item.account))
                        }
                    }
                }
                try db.execute("DELETE FROM item_search")
                for (id, owner, service, account) in names { try writeSearchTags(id, owner: owner, service, account) }
                try db.withStatement("INSERT INTO vault_meta (name, value) VALUES (?1, 'v1')") { (s) throws(DatabaseError) in
                    try s.bind(1, text: Self.searchIndexMarker)
                    try s.step()
                }
            }
        }
    }
}
