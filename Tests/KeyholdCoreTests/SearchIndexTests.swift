import Foundation
@testable import KeyholdCore
@testable import KeyholdVault
import KeyholdTestSupport
import Testing

/// The attribute-pair search index (schema migration 4) on real SQLite files: a search returns
/// exactly the caller's matching items, and rows edited while the store is closed (the broker
/// down) can hide an item but never return a non-matching or another user's item.
@Suite struct SearchIndexTests {
    /// SQL that undoes migration 4, for tests that rebuild an older database.
    static let undoMigration4 = "DROP TABLE item_search; DELETE FROM vault_meta WHERE name = 'search_index';"

    /// Secret Service names as `AttributeMapping.reference` folds them ("ss:" + sorted pairs).
    static func add(_ store: VaultStore, owner: UInt32 = 1000, _ service: String, _ account: String, _ value: String) throws -> StoredItem {
        try store.add(owner: owner, NewItem(service: service, account: account), secret: secret(value), audit: record(uid: owner))
    }

    static func accounts(_ items: [StoredItem]) -> [String] { items.map(\.account).sorted() }

    @Test func aSubsetQueryReturnsExactlyTheMatchingItems() throws {
        let dir = TempDir()
        let store = try openStore(dir)
        _ = try Self.add(store, "mail", "ss:application=app&user=ann", "s1")
        _ = try Self.add(store, "mail", "ss:application=app&user=bob", "s2")
        _ = try Self.add(store, "chat", "ss:application=app&user=ann", "s3")
        _ = try Self.add(store, "mail", "plain", "s4")  // a CLI put: {service: mail, account: plain}
        let app = try store.search(owner: 1000, attributes: ["application": "app"])
        #expect(app.items.count == 3 && app.damaged == 0)
        let annMail = try store.search(owner: 1000, attributes: ["service": "mail", "user": "ann"])
        #expect(annMail.items.map(\.account) == ["ss:application=app&user=ann"] && annMail.items[0].service == "mail")
        #expect(Self.accounts(try store.search(owner: 1000, attributes: ["service": "mail"]).items)
                == ["plain", "ss:application=app&user=ann", "ss:application=app&user=bob"])
        #expect(try store.search(owner: 1000, attributes: ["service": "mail", "account": "plain"]).items.map(\.account) == ["plain"])
        #expect(try store.search(owner: 1000, attributes: ["user": "ann", "application": "other"]).items.isEmpty)
        #expect(try store.search(owner: 1000, attributes: ["user": "carol"]).items.isEmpty)
        #expect(try store.search(owner: 1000, attributes: [:]).items.count == 4)
        // Creation order, like a listing.
        #expect(try store.search(owner: 1000, attributes: ["user": "ann"]).items.map(\.service) == ["mail", "chat"])
        // Tags follow a rename and vanish with a delete.
        let bob = try #require(try store.item(owner: 1000, service: "mail", account: "ss:application=app&user=bob"))
        let renamed = try store.replace(bob, with: NewItem(service: "mail", account: "ss:application=app&user=dan"),
                                        secret: secret("s2"), audit: record(.update))
        #expect(try store.search(owner: 1000, attributes: ["user": "bob"]).items.isEmpty)
        #expect(try store.search(owner: 1000, attributes: ["user": "dan"]).items.map(\.id) == [renamed.id])
        try store.delete(renamed, audit: record(.delete))
        #expect(try store.search(owner: 1000, attributes: ["user": "dan"]).items.isEmpty)
        #expect(try RawDatabase(dir.state + "/vault.db").int("SELECT count(*) FROM item_search WHERE item_id = x'\(renamed.id)'") == 0)
        // Limits as the wire has them.
        let many = Dictionary(uniqueKeysWithValues: (0...Limits.maxAttributePairs).map { ("k\($0)", "v") })
        #expect(throws: StoreError.tooLarge) { try store.search(owner: 1000, attributes: many) }
        #expect(throws: StoreError.tooLarge) { try store.search(owner: 1000, attributes: ["k": String(repeating: "x", count: Limits.maxTextBytes + 1)]) }
    }

    @Test func anotherOwnersItemsNeverComeBackEvenWithTheSameAttributes() throws {
        let dir = TempDir()
        let store = try openStore(dir)
        let mine = try Self.add(store, owner: 1000, "mail", "ss:user=ann", "mine")
        let theirs = try Self.add(store, owner: 1001, "mail", "ss:user=ann", "theirs")
        #expect(try store.search(owner: 1000, attributes: ["user": "ann"]).items.map(\.id) == [mine.id])
        #expect(try store.search(owner: 1001, attributes: ["user": "ann"]).items.map(\.id) == [theirs.id])
        #expect(try store.search(owner: 1002, attributes: ["user": "ann"]).items.isEmpty)
        #expect(try store.search(owner: 1002, attributes: [:]).items.isEmpty)
        // Tags differ per owner, and none holds a name.
        let db = try RawDatabase(dir.state + "/vault.db")
        let mineTags = Set(try db.blobs("SELECT tag FROM item_search WHERE item_id = x'\(mine.id)'"))
        let theirTags = Set(try db.blobs("SELECT tag FROM item_search WHERE item_id = x'\(theirs.id)'"))
        #expect(mineTags.count == 2 && theirTags.count == 2 && mineTags.isDisjoint(with: theirTags))
        #expect(!contains(fileBytes(dir.state + "/vault.db") + fileBytes(dir.state + "/vault.db-wal"), Array("ann".utf8)))
    }

    @Test func tamperedRowsNeverReturnAWrongItemAndLoseNoSecret() throws {
        let dir = TempDir()
        let store = try openStore(dir)
        let ann = try Self.add(store, owner: 1000, "mail", "ss:user=ann", "ann-secret")
        let bob = try Self.add(store, owner: 1000, "mail", "ss:user=bob", "bob-secret")
        let foreign = try Self.add(store, owner: 1001, "mail", "ss:user=ann", "foreign-secret")
        let annTag = store.searchTag(owner: 1000, key: "user", value: "ann")
        store.close()
        let db = try RawDatabase(dir.state + "/vault.db")
        let hexTag = RawDatabase.hex(annTag)
        // Bob's row now carries Ann's tag; a forged row points Ann's tag at another user's item,
        // and one at an item id that does not exist.
        try db.exec("""
            PRAGMA foreign_keys = OFF;
            UPDATE item_search SET tag = x'\(hexTag)' WHERE item_id = x'\(bob.id)';
            INSERT INTO item_search (item_id, tag) VALUES (x'\(foreign.id)', x'\(hexTag)');
            INSERT INTO item_search (item_id, tag) VALUES (x'\(String(repeating: "ab", count: 16))', x'\(hexTag)');
            """)
        var reopened = try openStore(dir)
        #expect(try reopened.search(owner: 1000, attributes: ["user": "ann"]).items.map(\.id) == [ann.id])
        #expect(try reopened.search(owner: 1000, attributes: ["user": "bob"]).items.isEmpty)  // its rows were moved: hidden
        #expect(try reopened.search(owner: 1000, attributes: ["service": "mail", "user": "ann"]).items.map(\.id) == [ann.id])
        #expect(try reopened.search(owner: 1001, attributes: ["user": "ann"]).items.map(\.id) == [foreign.id])
        reopened.close()
        // Every row deleted: searches find nothing, listing and reading still work.
        try db.exec("DELETE FROM item_search")
        reopened = try openStore(dir)
        #expect(try reopened.search(owner: 1000, attributes: ["user": "ann"]).items.isEmpty)
        #expect(try reopened.search(owner: 1000, attributes: [:]).items.count == 2)
        for (owner, account, value) in [(UInt32(1000), "ss:user=ann", "ann-secret"), (1000, "ss:user=bob", "bob-secret"),
                                         (1001, "ss:user=ann", "foreign-secret")] {
            let item = try #require(try reopened.item(owner: owner, service: "mail", account: account))
            try expectSecret(string(reopened.openSecret(item)), equals: value)
        }
        // The next write of an item restores its rows.
        let bobNow = try #require(try reopened.item(owner: 1000, service: "mail", account: "ss:user=bob"))
        _ = try reopened.replace(bobNow, with: NewItem(service: "mail", account: "ss:user=bob"), secret: secret("bob-secret"),
                                 audit: record(.update))
        #expect(try reopened.search(owner: 1000, attributes: ["user": "bob"]).items.count == 1)
    }

    /// A vault from before migration 4 (its table dropped, user_version 3) gets its rows on
    /// the next open, once: the marker stops a second backfill, and removing it only rebuilds.
    @Test func itemsFromBeforeTheIndexAreBackfilledOnOpen() throws {
        let dir = TempDir()
        let store = try openStore(dir)
        _ = try Self.add(store, owner: 1000, "mail", "ss:application=app&user=ann", "a")
        _ = try Self.add(store, owner: 1000, "bench", "acct-1", "b")  // as `keyhold put bench acct-1`
        _ = try Self.add(store, owner: 1001, "mail", "ss:application=app&user=ann", "c")
        store.close()
        try RawDatabase(dir.state + "/vault.db").exec("\(Self.undoMigration4) PRAGMA user_version = 3;")
        let upgraded = try openStore(dir)
        let db = try RawDatabase(dir.state + "/vault.db")
        #expect(try db.int("PRAGMA user_version") == Int64(VaultStore.schemaVersion))
        #expect(try db.int("SELECT count(*) FROM item_search") == 8)  // 3 + 2 + 3 pairs
        #expect(try db.int("SELECT count(*) FROM vault_meta WHERE name = 'search_index'") == 1)
        #expect(try upgraded.search(owner: 1000, attributes: ["application": "app"]).items.map(\.service) == ["mail"])
        #expect(try upgraded.search(owner: 1000, attributes: ["service": "bench", "account": "acct-1"]).items.count == 1)
        #expect(try upgraded.search(owner: 1001, attributes: ["user": "ann"]).items.count == 1)
        upgraded.close()
        // Reopening does not write the rows again.
        try db.exec("DELETE FROM item_search WHERE rowid = (SELECT min(rowid) FROM item_search)")
        _ = try openStore(dir)
        #expect(try db.int("SELECT count(*) FROM item_search") == 7)
        // Without the marker the whole index is rebuilt (idempotent: no duplicates).
        try db.exec("DELETE FROM vault_meta WHERE name = 'search_index'")
        _ = try openStore(dir)
        #expect(try db.int("SELECT count(*) FROM item_search") == 8)
    }
}
