import Foundation
@testable import KeyholdCore
@testable import KeyholdVault
import KeyholdTestSupport
import Testing

/// Issue 10, item 4, in the store: an item's expiry is kept with it and authenticated; a vault
/// from before the expiry migration opens and its items read with no expiry.
@Suite struct ExpiryStoreTests {
    @Test func expiryIsStoredAndBoundIntoTheBoxes() throws {
        let dir = TempDir()
        let store = try openStore(dir)
        let added = try store.add(owner: 1000, NewItem(service: "svc", account: "acct", expires: 5_000_000), secret: secret("s"),
                                  audit: record())
        #expect(added.expires == 5_000_000)
        let item = try #require(try store.item(owner: 1000, service: "svc", account: "acct"))
        #expect(item.expires == 5_000_000)
        let replaced = try store.replace(item, with: NewItem(service: "svc", account: "acct"), secret: secret("t"), audit: record(.update))
        #expect(replaced.expires == nil)
        #expect(try store.item(owner: 1000, service: "svc", account: "acct")?.expires == nil)
        // The associated data differs with and without an expiry, and between two expiries.
        var ad = replaced.associatedData
        let none = ad.encoded(for: .secret)
        ad.expires = 1
        let one = ad.encoded(for: .secret)
        ad.expires = 2
        #expect(none != one && one != ad.encoded(for: .secret))
        store.close()
        // Writing an expiry into the row by hand: the row no longer opens.
        try RawDatabase(dir.state + "/vault.db").exec("UPDATE items SET expires_us = 99")
        let reopened = try openStore(dir)
        #expect(throws: StoreError.integrity) { try reopened.item(owner: 1000, service: "svc", account: "acct") }
    }

    /// The database as the previous schema left it (no expiry column) opens after the
    /// migration; its items read with no expiry.
    @Test func aVaultFromBeforeTheExpiryMigrationOpens() throws {
        let dir = TempDir()
        let store = try openStore(dir)
        try store.add(owner: 1000, NewItem(service: "svc", account: "acct"), secret: secret("before"), audit: record())
        store.close()
        // The migration's number is schema.sql's business: found by what it adds. The later
        // ones are undone too (migration 4, the search index).
        let expiryMigration = try #require(Schema.migrations.first { $0.sql.contains("ADD COLUMN expires_us") })
        #expect(expiryMigration.version == 3)
        try RawDatabase(dir.state + "/vault.db").exec("""
            \(SearchIndexTests.undoMigration4)
            ALTER TABLE items DROP COLUMN expires_us;
            PRAGMA user_version = \(expiryMigration.version - 1);
            """)
        let upgraded = try openStore(dir)
        let item = try #require(try upgraded.item(owner: 1000, service: "svc", account: "acct"))
        #expect(item.expires == nil)
        try expectSecret(string(upgraded.openSecret(item)), equals: "before")
        let dated = try upgraded.replace(item, with: NewItem(service: "svc", account: "acct", expires: 7), secret: secret("after"),
                                         audit: record(.update))
        #expect(dated.expires == 7)
        try expectSecret(string(upgraded.openSecret(dated)), equals: "after")
    }
}
