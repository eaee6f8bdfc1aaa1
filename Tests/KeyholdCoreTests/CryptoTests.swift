import KeyholdCore
@testable import KeyholdVault
import KeyholdTestSupport
import Testing

@Suite struct CryptoTests {
    let vault = VaultKey.generate()

    @Test func sealOpenRoundTrip() throws {
        let key = ItemKey.generate()
        for text in ["", "x", "refresh-token-\u{0}-with-nul", String(repeating: "z", count: 70_000)] {
            let box = SealedBox.seal(Array(text.utf8), using: key, authenticating: [1, 2, 3])
            #expect(box.combined.count == text.utf8.count + 40)
            let opened = try box.open(using: key, authenticating: [1, 2, 3])
            expectSecret(string(opened), equals: text)
        }
    }

    @Test func associatedDataMismatchFails() throws {
        let key = ItemKey.generate()
        let box = SealedBox.seal(Array("secret".utf8), using: key, authenticating: [1, 2, 3])
        #expect(throws: CryptoError.authenticationFailed) { try box.open(using: key, authenticating: [1, 2, 4]) }
        #expect(throws: CryptoError.authenticationFailed) { try box.open(using: key, authenticating: []) }
        #expect(throws: CryptoError.authenticationFailed) { try box.open(using: ItemKey.generate(), authenticating: [1, 2, 3]) }
    }

    @Test func everyFlippedByteFails() throws {
        let key = ItemKey.generate()
        let box = SealedBox.seal(Array("secret".utf8), using: key, authenticating: [9])
        for i in box.combined.indices {
            var bytes = box.combined
            bytes[i] ^= 0x01
            #expect(throws: CryptoError.authenticationFailed) { try SealedBox(combined: bytes).open(using: key, authenticating: [9]) }
        }
        #expect(throws: CryptoError.malformed) { try SealedBox(combined: Array(box.combined.prefix(39))) }
    }

    @Test func nonceIsFreshPerBox() {
        let key = ItemKey.generate()
        let a = SealedBox.seal([1], using: key, authenticating: [])
        let b = SealedBox.seal([1], using: key, authenticating: [])
        #expect(a.nonce != b.nonce)
        #expect(a.combined != b.combined)
    }

    /// The sealed details of 150 audit entries committed in one group carry 150 different nonces.
    @Test func auditDetailNoncesAreEachUsedOnce() throws {
        let dir = TempDir()
        let store = try openStore(dir)
        _ = store.groupTransaction {
            for i in 0..<150 { _ = try? store.memberTransaction { () throws(StoreError) in try store.append(record(.get, reason: "r\(i)")) } }
        }
        store.close()
        let db = try Database(path: dir.state + "/vault.db")
        defer { db.close() }
        let nonces: [[UInt8]] = try db.withStatement("SELECT details FROM audit WHERE details IS NOT NULL") { (s) throws(DatabaseError) in
            var out: [[UInt8]] = []
            while try s.step() { out.append(Array(s.blob(0).prefix(Nonce.byteCount))) }
            return out
        }
        #expect(nonces.count == 150)
        #expect(Set(nonces).count == nonces.count)
    }

    @Test func blindIndexIsStableKeyedAndCanonical() {
        let k = vault.blindIndexKey
        let a = BlindIndex(key: k, owner: 1000, service: "svc", account: "acct")
        #expect(a == BlindIndex(key: k, owner: 1000, service: "svc", account: "acct"))
        #expect(a.bytes.count == 32)
        #expect(a != BlindIndex(key: k, owner: 1001, service: "svc", account: "acct"))
        #expect(a != BlindIndex(key: VaultKey.generate().blindIndexKey, owner: 1000, service: "svc", account: "acct"))
        // Length prefixes: moving a character across the field boundary changes the index.
        #expect(BlindIndex(key: k, owner: 1, service: "ab", account: "c") != BlindIndex(key: k, owner: 1, service: "a", account: "bc"))
    }

    @Test func subkeysAreDistinctAndDeterministic() throws {
        let bytes = SecureBytes.random(count: 32)
        let copy = SecureBytes(count: 32)
        copy.withUnsafeMutableBytes { dst in bytes.withUnsafeBytes { dst.copyMemory(from: $0) } }
        let v1 = try VaultKey(bytes: bytes), v2 = try VaultKey(bytes: copy)
        // Same vault key → same subkeys: a box sealed under one opens under the other.
        let box = SealedBox.seal([7], using: v1.attributeKey, authenticating: [])
        #expect(try box.open(using: v2.attributeKey, authenticating: []).count == 1)
        // Different purposes → different keys.
        #expect(throws: CryptoError.authenticationFailed) { try box.open(using: v1.wrappingKey, authenticating: []) }
        #expect(throws: CryptoError.malformed) { try VaultKey(bytes: SecureBytes.random(count: 31)) }
    }

    @Test func argon2idPasswordKeyWrapsAndRefusesWrongPassword() throws {
        let params = PasswordHashParameters.generate(.interactive)
        #expect(params.salt.count == 16)
        let k1 = try PasswordKey.derive(password: secret("correct horse"), parameters: params)
        let k2 = try PasswordKey.derive(password: secret("correct horse"), parameters: params)
        let wrong = try PasswordKey.derive(password: secret("correct horsf"), parameters: params)
        let itemKeyBytes = SecureBytes.random(count: 32)
        let box = SealedBox.seal(itemKeyBytes, using: k1, authenticating: [1])
        #expect(try box.open(using: k2, authenticating: [1]).constantTimeEquals(itemKeyBytes))
        #expect(throws: CryptoError.authenticationFailed) { try box.open(using: wrong, authenticating: [1]) }
        // Another salt, same password: another key.
        let other = try PasswordKey.derive(password: secret("correct horse"), parameters: .generate(.interactive))
        #expect(throws: CryptoError.authenticationFailed) { try box.open(using: other, authenticating: [1]) }
    }

    @Test func itemIDHex() throws {
        let id = ItemID.random()
        #expect(id.description.count == 32)
        #expect(ItemID(hex: id.description) == id)
        #expect(ItemID(hex: "zz") == nil)
        #expect(ItemID(bytes: [1, 2]) == nil)
    }

    @Test func authMethodText() {
        #expect(AuthMethod.none.description == "none")
        #expect(AuthMethod(factors: [.appPassword, .password]).description == "password+app-password")
        #expect(AuthMethod(text: "password+app-password") == AuthMethod.password.adding(.appPassword))
        #expect(AuthMethod(text: "app-password+password") == nil)  // not canonical
        #expect(AuthMethod(text: "password+") == nil)
        #expect(AuthMethod(text: "root") == nil)
    }
}
