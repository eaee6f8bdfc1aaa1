import Foundation
import KeyholdCore
import KeyholdVault
import KeyholdTestSupport
import Testing

@Suite struct HostileRowTests {
    /// Junk in every metadata column, written directly to the file: each read is an integrity
    /// failure or a damaged row in the listing, never a crash and never another item.
    @Test(arguments: [
        "kind = 99", "kind = -1", "reuse_seconds = -1", "reuse_seconds = 301", "owner_uid = 4294967296",
        "policy = 'garbage words'", "policy = 'device-passcode  or user-presence'", "policy = ''",
        "biometry_state = x'00'", "pwhash_params = x'00'", "pwhash_params = randomblob(64)",
        "allowed_executables = x''", "allowed_executables = randomblob(40)", "attributes = x''",
        "attributes = randomblob(100)", "id = randomblob(16)", "wrapped_key = x''",
        "wrapped_key = randomblob(72)", "secret = x''", "secret = randomblob(10)", "lookup = randomblob(32)",
    ])
    func junkColumnIsIntegrity(_ assignment: String) throws {
        let dir = TempDir()
        do {
            let store = try openStore(dir)
            _ = try store.add(owner: 1000, NewItem(service: "svc", account: "victim"), secret: secret("v"), audit: record())
            _ = try store.add(owner: 1000, NewItem(service: "svc", account: "bystander"), secret: secret("b"), audit: record())
            store.close()
        }
        let raw = try RawDatabase(dir.state + "/vault.db")
        let victim = try raw.blobs("SELECT id FROM items ORDER BY rowid LIMIT 1")[0]
        try raw.exec("UPDATE items SET \(assignment) WHERE id = x'\(RawDatabase.hex(victim))'")
        let store = try openStore(dir)
        #expect(throws: StoreError.integrity) {
            guard let item = try store.item(owner: 1000, service: "svc", account: "victim") else { throw StoreError.integrity }
            _ = try store.openSecret(item)
        }
        let bystander = try #require(try store.item(owner: 1000, service: "svc", account: "bystander"))
        try expectSecret(string(store.openSecret(bystander)), equals: "b")
        let listed = try store.items(owner: 1000)
        #expect(listed.items.map(\.account).contains("bystander"))
        // A listing opens only the attribute box: an edited secret, wrapped key or lookup still
        // lists under its own authenticated names (reading it fails, as checked above).
        #expect(!listed.items.map(\.account).contains("victim") || assignment.hasPrefix("wrapped_key")
                || assignment.hasPrefix("secret") || assignment.hasPrefix("lookup"))
    }
}
