import Foundation
import KeyholdCore
import KeyholdVault
import KeyholdTestSupport
import Testing

/// Issue 8, item 6: someone who can write vault.db (a restored backup, an offline disk) but
/// has no key keeps an older copy of an item's row and puts it back later.
@Suite struct ItemGenerationTests {
    static let itemColumns = ["lookup", "kind", "policy", "allowed_executables", "reuse_seconds", "biometry_state",
                              "pwhash_params", "attributes", "wrapped_key", "secret", "created_us", "updated_us", "generation"]

    /// Every column of the item's row, as SQL literals (how an attacker keeps a copy).
    static func saveRow(_ db: RawDatabase, id: ItemID) throws -> [String: String] {
        var out: [String: String] = [:]
        for c in itemColumns {
            out[c] = try db.blobs("SELECT quote(\(c)) FROM items WHERE id = x'\(id)'").first.map { String(decoding: $0, as: UTF8.self) }
        }
        return out
    }

    static func restoreRow(_ db: RawDatabase, id: ItemID, _ row: [String: String]) throws {
        let sets = itemColumns.map { "\($0) = \(row[$0]!)" }.joined(separator: ", ")
        try db.exec("UPDATE items SET \(sets) WHERE id = x'\(id)'")
    }

    static func saveTable(_ db: RawDatabase, _ table: String) throws {
        try db.exec("DROP TABLE IF EXISTS kept_\(table); CREATE TABLE kept_\(table) AS SELECT * FROM \(table)")
    }

    static func restoreTable(_ db: RawDatabase, _ table: String) throws {
        try db.exec("DELETE FROM \(table); INSERT INTO \(table) SELECT * FROM kept_\(table)")
    }

    /// An item stored with policy `none`, its row copied, then the policy tightened.
    static func tightened(_ dir: TempDir, keepTables: Bool = false) throws -> (ItemID, [String: String]) {
        let store = try openStore(dir)
        let item = try store.add(owner: 1000, NewItem(service: "svc", account: "acct"), secret: secret("old token"), audit: record())
        store.close()
        let db = try RawDatabase(dir.state + "/vault.db")
        let old = try saveRow(db, id: item.id)
        if keepTables {
            try saveTable(db, "item_generation")
            try saveTable(db, "item_generation_head")
        }
        let reopened = try openStore(dir)
        var changed = NewItem(service: "svc", account: "acct")
        changed.access = AccessControl(policy: try Policy(parsing: "device-passcode"))
        let current = try #require(try reopened.item(owner: 1000, service: "svc", account: "acct"))
        let replaced = try reopened.replace(current, with: changed, secret: secret("new token"), audit: record(.update))
        #expect(replaced.generation == current.generation + 1)
        reopened.close()
        return (item.id, old)
    }

    @Test func olderRowPutBackAfterPolicyTightenedIsIntegrity() throws {
        let dir = TempDir()
        let (id, old) = try Self.tightened(dir)
        try Self.restoreRow(try RawDatabase(dir.state + "/vault.db"), id: id, old)
        let store = try openStore(dir)
        #expect(throws: StoreError.integrity) { try store.item(owner: 1000, service: "svc", account: "acct") }
        #expect(try store.items(owner: 1000).damaged == 1)
    }

    @Test func olderRowWithItsGenerationRecordPutBackIsIntegrity() throws {
        let dir = TempDir()
        let (id, old) = try Self.tightened(dir, keepTables: true)
        let db = try RawDatabase(dir.state + "/vault.db")
        try Self.restoreRow(db, id: id, old)
        try Self.restoreTable(db, "item_generation")
        try Self.restoreTable(db, "item_generation_head")
        let store = try openStore(dir)
        #expect(throws: StoreError.integrity) { try store.item(owner: 1000, service: "svc", account: "acct") }
        // Other items do not open either: the record vouches for none of them any more.
        #expect(throws: StoreError.integrity) {
            try store.add(owner: 1000, NewItem(service: "other", account: "a"), secret: secret("x"), audit: record())
        }
        // Audit still works and does not re-tag (launder) the altered record.
        try store.append(record(.get))
        #expect(throws: StoreError.integrity) { try store.item(owner: 1000, service: "svc", account: "acct") }
    }

    @Test func generationColumnEditedToCurrentIsIntegrity() throws {
        let dir = TempDir()
        let (id, old) = try Self.tightened(dir)
        let db = try RawDatabase(dir.state + "/vault.db")
        try Self.restoreRow(db, id: id, old)
        try db.exec("UPDATE items SET generation = 2 WHERE id = x'\(id)'")
        let store = try openStore(dir)
        #expect(throws: StoreError.integrity) { try store.item(owner: 1000, service: "svc", account: "acct") }
    }

    @Test func deletedItemPutBackIsIntegrity() throws {
        let dir = TempDir()
        let store = try openStore(dir)
        let item = try store.add(owner: 1000, NewItem(service: "svc", account: "acct"), secret: secret("t"), audit: record())
        store.close()
        let db = try RawDatabase(dir.state + "/vault.db")
        try db.exec("CREATE TABLE kept AS SELECT * FROM items")
        let reopened = try openStore(dir)
        try reopened.delete(item, audit: record(.delete))
        reopened.close()
        try db.exec("INSERT INTO items SELECT * FROM kept")
        let again = try openStore(dir)
        #expect(throws: StoreError.integrity) { try again.item(owner: 1000, service: "svc", account: "acct") }
        // Its owner can clear it and store the name again.
        try again.deleteDamaged(owner: 1000, service: "svc", account: "acct", audit: record(.delete))
        let fresh = try again.add(owner: 1000, NewItem(service: "svc", account: "acct"), secret: secret("n"), audit: record())
        try expectSecret(string(again.openSecret(fresh)), equals: "n")
    }

    @Test func changesBasedOnAnOlderReadAreConflicts() throws {
        let dir = TempDir()
        let store = try openStore(dir)
        let first = try store.add(owner: 1000, NewItem(service: "svc", account: "acct"), secret: secret("a"), audit: record())
        #expect(first.generation == 1)
        // A failed change (rolled back) leaves the record as it was.
        #expect(throws: StoreError.duplicate) {
            try store.add(owner: 1000, NewItem(service: "svc", account: "acct"), secret: secret("dup"), audit: record())
        }
        try expectSecret(string(store.openSecret(first)), equals: "a")
        let second = try store.replace(first, with: NewItem(service: "svc", account: "acct"), secret: secret("b"), audit: record(.update))
        #expect(second.generation == 2)
        #expect(throws: StoreError.conflict) {
            try store.replace(first, with: NewItem(service: "svc", account: "acct"), secret: secret("c"), audit: record(.update))
        }
        #expect(throws: StoreError.conflict) { try store.delete(first, audit: record(.delete)) }
        #expect(StoreError.conflict.outcome == .conflict && Outcome.conflict.rawValue == 14)
        try expectSecret(string(store.openSecret(second)), equals: "b")
        try store.delete(second, audit: record(.delete))
        #expect(throws: StoreError.notFound) { try store.delete(second, audit: record(.delete)) }
        // The record survives reopening and verifies against the audit head.
        let third = try store.add(owner: 1000, NewItem(service: "svc", account: "acct"), secret: secret("d"), audit: record())
        store.close()
        let reopened = try openStore(dir)
        #expect(try reopened.item(owner: 1000, service: "svc", account: "acct")?.generation == third.generation)
        #expect(try reopened.verifyAudit() == .intact(count: 4))
    }

    /// In a group commit, a member undone after its `add` returned (its savepoint rolled back)
    /// must not leave the in-memory record ahead of the database: the next writes would tag a
    /// digest of items that do not exist, and after a restart every item would fail.
    @Test func aRolledBackMemberDoesNotLeaveTheRecordBehind() throws {
        let dir = TempDir()
        let store = try openStore(dir)
        let committed = store.groupTransaction {
            _ = try? store.memberTransaction { () throws(StoreError) in
                try store.add(owner: 1000, NewItem(service: "undone", account: "a"), secret: secret("u"), audit: record())
                throw StoreError.notFound
            }
        }
        #expect(committed)
        #expect(try store.item(owner: 1000, service: "undone", account: "a") == nil)
        let kept = try store.add(owner: 1000, NewItem(service: "kept", account: "a"), secret: secret("k"), audit: record())
        try expectSecret(string(store.openSecret(kept)), equals: "k")
        store.close()
        let reopened = try openStore(dir)
        let again = try #require(try reopened.item(owner: 1000, service: "kept", account: "a"))
        try expectSecret(string(reopened.openSecret(again)), equals: "k")
    }
}
