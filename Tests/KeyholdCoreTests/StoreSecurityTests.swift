import Foundation
import KeyholdCore
import KeyholdVault
import KeyholdTestSupport
import Testing

/// Refusals at open, and an attacker editing the database file directly.
@Suite struct StoreSecurityTests {
    @Test func createsPrivateFilesWhateverTheUmask() throws {
        let dir = TempDir()
        let old = umask(0)
        defer { umask(old) }
        let store = try openStore(dir)
        _ = try store.add(owner: 1, NewItem(service: "s", account: "a"), secret: secret("x"), audit: record())
        #expect(fileMode(dir.state) == 0o700)
        #expect(fileMode(dir.state + "/vault.key") == 0o600)
        #expect(fileMode(dir.state + "/vault.db") == 0o600)
        #expect(fileMode(dir.state + "/vault.db-wal") & 0o077 == 0)
        #expect(fileBytes(dir.state + "/vault.key").count == 32)
    }

    @Test func refusesGroupOrOtherAccessibleDirectory() throws {
        let dir = TempDir()
        #expect(mkdir(dir.state, 0o755) == 0 && chmod(dir.state, 0o755) == 0)
        #expect(throws: StoreError.insecurePermissions(path: dir.state)) { try openStore(dir) }
        #expect(!FileManager.default.fileExists(atPath: dir.state + "/vault.key"))  // nothing created
        #expect(chmod(dir.state, 0o710) == 0)
        #expect(throws: StoreError.insecurePermissions(path: dir.state)) { try openStore(dir) }
        #expect(chmod(dir.state, 0o700) == 0)
        _ = try openStore(dir)
    }

    @Test func refusesSymlinkedStateDirectory() throws {
        let dir = TempDir()
        let real = dir.path + "/real"
        #expect(mkdir(real, 0o700) == 0)
        #expect(symlink(real, dir.state) == 0)
        #expect(throws: StoreError.insecurePermissions(path: dir.state)) { try openStore(dir) }
    }

    @Test func refusesBadKeyFilesAndNeverOverwritesThem() throws {
        let dir = TempDir()
        do { let s = try openStore(dir); _ = try s.add(owner: 1, NewItem(service: "s", account: "a"), secret: secret("x"), audit: record()) }
        let keyPath = dir.state + "/vault.key"
        let original = fileBytes(keyPath)

        #expect(chmod(keyPath, 0o644) == 0)
        #expect(throws: StoreError.insecurePermissions(path: keyPath)) { try openStore(dir) }
        #expect(chmod(keyPath, 0o640) == 0)
        #expect(throws: StoreError.insecurePermissions(path: keyPath)) { try openStore(dir) }
        #expect(chmod(keyPath, 0o600) == 0)
        expectSecret(fileBytes(keyPath), equals: original)

        // Truncated key file: refused, left as it is.
        #expect(truncate(keyPath, 16) == 0)
        #expect(throws: StoreError.keyFileInvalid) { try openStore(dir) }
        #expect(fileBytes(keyPath) == Array(original.prefix(16)))
        // Overlong.
        try Data(original + [0]).write(to: URL(fileURLWithPath: keyPath))
        #expect(throws: StoreError.keyFileInvalid) { try openStore(dir) }
        // Another 32-byte key: the database's key check refuses it (not "every item damaged").
        try Data(repeating: 7, count: 32).write(to: URL(fileURLWithPath: keyPath))
        #expect(chmod(keyPath, 0o600) == 0)
        #expect(throws: StoreError.keyFileInvalid) { try openStore(dir) }
        #expect(fileBytes(keyPath) == [UInt8](repeating: 7, count: 32))
        // Missing key for an existing vault: refused, no new key made.
        #expect(unlink(keyPath) == 0)
        #expect(throws: StoreError.keyFileInvalid) { try openStore(dir) }
        #expect(!FileManager.default.fileExists(atPath: keyPath))
        // The original key opens it again.
        try Data(original).write(to: URL(fileURLWithPath: keyPath))
        #expect(chmod(keyPath, 0o600) == 0)
        let store = try openStore(dir)
        try expectSecret(string(store.openSecret(#require(try store.item(owner: 1, service: "s", account: "a")))), equals: "x")
    }

    @Test func refusesForeignAndNonSQLiteDatabaseFiles() throws {
        // Someone else's SQLite database.
        let dir = TempDir()
        #expect(mkdir(dir.state, 0o700) == 0)
        let dbPath = dir.state + "/vault.db"
        do {
            let raw = try RawDatabase.createFile(dbPath)
            try raw.exec("CREATE TABLE notes (body TEXT); INSERT INTO notes VALUES ('hello');")
        }
        #expect(chmod(dbPath, 0o600) == 0)
        let foreign = fileBytes(dbPath)
        #expect(throws: StoreError.notAKeyholdDatabase) { try openStore(dir) }
        #expect(fileBytes(dbPath) == foreign)  // not converted to WAL, not migrated
        #expect(!FileManager.default.fileExists(atPath: dir.state + "/vault.key"))

        // Not SQLite at all.
        let dir2 = TempDir()
        #expect(mkdir(dir2.state, 0o700) == 0)
        let junk = [UInt8]("this is not a database, it is a shopping list\n".utf8) + [UInt8](repeating: 0x5a, count: 8000)
        try Data(junk).write(to: URL(fileURLWithPath: dir2.state + "/vault.db"))
        #expect(chmod(dir2.state + "/vault.db", 0o600) == 0)
        #expect(throws: StoreError.notAKeyholdDatabase) { try openStore(dir2) }
        #expect(fileBytes(dir2.state + "/vault.db") == junk)

        // A group-readable database file.
        let dir3 = TempDir()
        _ = try openStore(dir3)
        #expect(chmod(dir3.state + "/vault.db", 0o640) == 0)
        #expect(throws: StoreError.insecurePermissions(path: dir3.state + "/vault.db")) { try openStore(dir3) }
    }

    @Test func refusesNewerSchemaVersion() throws {
        let dir = TempDir()
        _ = try openStore(dir)
        try RawDatabase(dir.state + "/vault.db").exec("PRAGMA user_version = \(VaultStore.schemaVersion + 1)")
        #expect(throws: StoreError.unsupportedVersion(found: VaultStore.schemaVersion + 1, known: VaultStore.schemaVersion)) {
            try openStore(dir)
        }
    }

    /// Three items of one owner; returns their ids in order.
    private func seeded(_ dir: TempDir) throws -> [ItemID] {
        let store = try openStore(dir)
        var ids: [ItemID] = []
        for (i, policy) in ["device-passcode", "user-presence", "device-passcode"].enumerated() {
            let access = AccessControl(policy: try Policy(parsing: policy))
            ids.append(try store.add(owner: 1000, NewItem(service: "svc", account: "acct\(i)", access: access),
                                     secret: secret("secret-\(i)"), audit: record()).id)
        }
        store.close()
        return ids
    }

    /// Applies `tamper` to the closed database, then checks the named accounts read as
    /// `.integrity` and every other item still opens.
    private func expectIntegrity(broken: Set<Int>, _ tamper: (RawDatabase, [String]) throws -> Void) throws {
        let dir = TempDir()
        let ids = try seeded(dir)
        let hex = ids.map { "x'\(RawDatabase.hex($0.bytes))'" }
        do { try tamper(try RawDatabase(dir.state + "/vault.db"), hex) }
        let store = try openStore(dir)
        for i in 0..<3 {
            if broken.contains(i) {
                #expect(throws: StoreError.integrity) {
                    // Either the lookup or the secret fails; never a secret, never another item.
                    let item = try store.item(owner: 1000, service: "svc", account: "acct\(i)")
                    if let item { _ = try store.openSecret(item) } else { throw StoreError.integrity }
                }
            } else {
                let item = try #require(try store.item(owner: 1000, service: "svc", account: "acct\(i)"))
                try expectSecret(string(store.openSecret(item)), equals: "secret-\(i)")
            }
        }
        let listed = try store.items(owner: 1000)
        #expect(listed.items.count + listed.damaged == 3)
    }

    @Test func flippedCiphertextByteIsIntegrity() throws {
        try expectIntegrity(broken: [1]) { db, ids in
            var box = try db.blobs("SELECT secret FROM items WHERE id = \(ids[1])")[0]
            box[box.count / 2] ^= 0x40
            try db.setBlob("items", "secret", box, where: "id = \(ids[1])")
        }
    }

    @Test func swappedSecretsAreIntegrity() throws {
        try expectIntegrity(broken: [0, 2]) { db, ids in
            let a = try db.blobs("SELECT secret FROM items WHERE id = \(ids[0])")[0]
            let b = try db.blobs("SELECT secret FROM items WHERE id = \(ids[2])")[0]
            try db.setBlob("items", "secret", b, where: "id = \(ids[0])")
            try db.setBlob("items", "secret", a, where: "id = \(ids[2])")
        }
    }

    @Test func policyEditedToNoneIsIntegrity() throws {
        try expectIntegrity(broken: [0]) { db, ids in
            try db.exec("UPDATE items SET policy = 'none' WHERE id = \(ids[0])")
        }
    }

    @Test func otherAccessColumnsEditedAreIntegrity() throws {
        try expectIntegrity(broken: [0, 1, 2]) { db, ids in
            try db.exec("UPDATE items SET reuse_seconds = 300 WHERE id = \(ids[0])")
            try db.exec("UPDATE items SET kind = 1 WHERE id = \(ids[1])")
            try db.exec("UPDATE items SET owner_uid = 1000, allowed_executables = x'00' WHERE id = \(ids[2])")
        }
    }

    @Test func swappedWrappedKeysAreIntegrity() throws {
        try expectIntegrity(broken: [0, 1]) { db, ids in
            let a = try db.blobs("SELECT wrapped_key FROM items WHERE id = \(ids[0])")[0]
            let b = try db.blobs("SELECT wrapped_key FROM items WHERE id = \(ids[1])")[0]
            try db.setBlob("items", "wrapped_key", b, where: "id = \(ids[0])")
            try db.setBlob("items", "wrapped_key", a, where: "id = \(ids[1])")
        }
    }

    @Test func swappedLookupsAreIntegrity() throws {
        try expectIntegrity(broken: [0, 2]) { db, ids in
            let a = try db.blobs("SELECT lookup FROM items WHERE id = \(ids[0])")[0]
            let b = try db.blobs("SELECT lookup FROM items WHERE id = \(ids[2])")[0]
            try db.setBlob("items", "lookup", [0], where: "id = \(ids[0])")
            try db.setBlob("items", "lookup", a, where: "id = \(ids[2])")
            try db.setBlob("items", "lookup", b, where: "id = \(ids[0])")
        }
    }

    @Test func rowMovedToAnotherOwnerIsIntegrity() throws {
        let dir = TempDir()
        let ids = try seeded(dir)
        try RawDatabase(dir.state + "/vault.db").exec("UPDATE items SET owner_uid = 2000 WHERE id = x'\(RawDatabase.hex(ids[0].bytes))'")
        let store = try openStore(dir)
        #expect(try store.items(owner: 2000).damaged == 1)
        #expect(try store.items(owner: 2000).items.isEmpty)
        #expect(try store.items(owner: 1000).items.count == 2)
    }

    @Test func noNamesOrSecretsInPlaintextOnDisk() throws {
        let dir = TempDir()
        let service = "svc-marker-Qz7Kp", account = "acct-marker-Wv3Rt", label = "label-marker-Jd9Lx"
        let secretText = "secret-marker-Hn4Ms", reason = "reason-marker-Bc2Ty", appPassword = "apppw-marker-Xe8Nu"
        let markers = [service, account, label, secretText, reason, appPassword]
        let store = try openStore(dir)
        let plain = try store.add(owner: 1000, NewItem(service: service, account: account, label: label),
                                  secret: secret(secretText), audit: record(service: service, account: account, reason: reason))
        let access = AccessControl(policy: try Policy(parsing: "app-password"))
        _ = try store.add(owner: 1000, NewItem(service: service + "2", account: account, label: label, access: access),
                          secret: secret(secretText), appPassword: try sealingKey(appPassword),
                          audit: record(service: service + "2", account: account, reason: reason))
        try store.append(record(.get, service: service, account: account, reason: reason))
        _ = try store.replace(plain, with: NewItem(service: service, account: account, label: label), secret: secret(secretText + "b"),
                              audit: record(.update, service: service, account: account, reason: reason))
        func scan(_ when: String) {
            let files = (try? FileManager.default.contentsOfDirectory(atPath: dir.state)) ?? []
            #expect(files.contains("vault.db"))
            for file in files {
                let bytes = fileBytes(dir.state + "/" + file)
                for m in markers {
                    #expect(!contains(bytes, Array(m.utf8)), "\(when): a marker is in plaintext in \(file)")
                }
            }
        }
        #expect(FileManager.default.fileExists(atPath: dir.state + "/vault.db-wal"))
        scan("while open")
        store.close()
        scan("after close")
    }
}

extension RawDatabase {
    /// Creates a plain SQLite database file (not Keyhold's).
    static func createFile(_ path: String) throws -> RawDatabase {
        precondition(close(open(path, O_CREAT | O_WRONLY, 0o600)) == 0)
        return try RawDatabase(path)
    }
}
