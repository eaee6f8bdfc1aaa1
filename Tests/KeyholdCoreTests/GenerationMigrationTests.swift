import Foundation
@testable import KeyholdCore
@testable import KeyholdVault
import KeyholdTestSupport
import Testing

/// A vault written before item generations (schema 1, boxes sealed without a generation)
/// opens after migration 2: its items are at generation 0 and read as before, and the next
/// change moves them to generation 1.
@Suite struct GenerationMigrationTests {
    @Test func aSchemaOneVaultOpensAndItsItemsRead() throws {
        let dir = TempDir()
        let store = try openStore(dir)
        let added = try store.add(owner: 1000, NewItem(service: "svc", account: "acct", label: "L"), secret: secret("legacy"), audit: record())
        // Re-seal the row as schema 1 wrote it: the version 1 associated data (generation 0).
        var ad = added.associatedData
        ad.generation = 0
        var names = CanonicalEncoder(domain: "attributes")
        names.append("svc"); names.append("acct"); names.append("L")
        let attributes = SealedBox.seal(names.bytes, using: store.attributeKey, authenticating: ad.encoded(for: .attributes))
        let itemKey = ItemKey.generate()
        let secretBox = SealedBox.seal(secret("legacy"), using: itemKey, authenticating: ad.encoded(for: .secret))
        let wrapped = SealedBox.seal(itemKey.keyBytes.bytes, using: store.wrappingKey, authenticating: ad.encoded(for: .wrappedKey))
        store.close()
        let db = try RawDatabase(dir.state + "/vault.db")
        let id = "x'\(added.id)'"
        try db.setBlob("items", "attributes", attributes.combined, where: "id = \(id)")
        try db.setBlob("items", "secret", secretBox.combined, where: "id = \(id)")
        try db.setBlob("items", "wrapped_key", wrapped.combined, where: "id = \(id)")
        // Undo migration 2 as if it never ran.
        try db.exec("""
            \(SearchIndexTests.undoMigration4)
            DROP TABLE item_generation; DROP TABLE item_generation_head;
            ALTER TABLE items DROP COLUMN generation;
            ALTER TABLE items DROP COLUMN expires_us;
            PRAGMA user_version = 1;
            """)

        let upgraded = try openStore(dir)
        let item = try #require(try upgraded.item(owner: 1000, service: "svc", account: "acct"))
        #expect(item.generation == 0)
        try expectSecret(string(upgraded.openSecret(item)), equals: "legacy")
        let replaced = try upgraded.replace(item, with: NewItem(service: "svc", account: "acct"), secret: secret("new"), audit: record(.update))
        #expect(replaced.generation == 1)
        upgraded.close()
        let reopened = try openStore(dir)
        let current = try #require(try reopened.item(owner: 1000, service: "svc", account: "acct"))
        try expectSecret(string(reopened.openSecret(current)), equals: "new")
    }
}
