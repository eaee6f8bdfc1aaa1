import Foundation
import KeyholdCore
import KeyholdVault
import KeyholdTestSupport
import Testing

@Suite struct StoreTests {
    @Test func addGetReplaceDeleteList() throws {
        let dir = TempDir()
        let store = try openStore(dir)
        let item = NewItem(service: "svc", account: "alice", label: "Alice's token", kind: .refreshToken)
        let added = try store.add(owner: 1000, item, secret: secret("tok-1"), audit: record(service: "svc", account: "alice"))
        #expect(added.service == "svc" && added.account == "alice" && added.kind == .refreshToken && added.owner == 1000)
        #expect(added.createdAt > 0 && added.createdAt == added.updatedAt)

        let got = try #require(try store.item(owner: 1000, service: "svc", account: "alice"))
        #expect(got == added)
        try expectSecret(string(store.openSecret(got)), equals: "tok-1")
        #expect(try store.item(owner: 1000, service: "svc", account: "bob") == nil)

        var changed = item
        changed.label = "new label"
        changed.access = AccessControl(policy: try Policy(parsing: "device-passcode"), allowedExecutables: ["/usr/bin/a"], reuseSeconds: 60)
        let replaced = try store.replace(got, with: changed, secret: secret("tok-2"), audit: record(.update))
        #expect(replaced.id == added.id && replaced.createdAt == added.createdAt)
        let again = try #require(try store.item(owner: 1000, service: "svc", account: "alice"))
        #expect(again.label == "new label" && again.access == changed.access)
        try expectSecret(string(store.openSecret(again)), equals: "tok-2")
        // A handle read before the policy was tightened opens nothing: the decision made on it
        // (no authentication for `none`) does not cover the row as it is now.
        #expect(throws: StoreError.conflict) { try store.openSecret(got) }
        // Replaced under the same access, a stale handle opens the current row, never an old key.
        let sameAccess = try store.replace(again, with: changed, secret: secret("tok-3"), audit: record(.update))
        try expectSecret(string(store.openSecret(again)), equals: "tok-3")
        let opened = try store.openCurrentSecret(again)
        expectSecret(string(opened.secret), equals: "tok-3")
        #expect(opened.current.generation == sameAccess.generation)

        _ = try store.add(owner: 1000, NewItem(service: "svc2", account: "alice"), secret: secret(""), audit: record())
        let listed = try store.items(owner: 1000)
        #expect(listed.damaged == 0)
        #expect(listed.items.map(\.service) == ["svc", "svc2"])

        try store.delete(sameAccess, audit: record(.delete))
        #expect(try store.item(owner: 1000, service: "svc", account: "alice") == nil)
        #expect(throws: StoreError.notFound) { try store.openSecret(sameAccess) }
        #expect(throws: StoreError.notFound) { try store.delete(sameAccess, audit: record(.delete)) }
        #expect(throws: StoreError.notFound) { try store.replace(sameAccess, with: item, secret: secret("x"), audit: record(.update)) }
        #expect(try store.items(owner: 1000).items.count == 1)
        // Every mutation wrote exactly one audit entry.
        #expect(try store.verifyAudit() == .intact(count: 5))
    }

    @Test func emptyAndMaximalSecretsAndLimits() throws {
        let dir = TempDir()
        let store = try openStore(dir)
        // Empty secrets are accepted (documented in VaultStore.validate).
        let empty = try store.add(owner: 1, NewItem(service: "s", account: "empty"), secret: secret(""), audit: record())
        #expect(try store.openSecret(empty).count == 0)
        let max = SecureBytes.random(count: Limits.maxSecretBytes)
        let big = try store.add(owner: 1, NewItem(service: "s", account: "max"), secret: max, audit: record())
        #expect(try store.openSecret(big).constantTimeEquals(max))
        let binary = SecureBytes(copying: [0, 255, 10, 13, 0])
        let bin = try store.add(owner: 1, NewItem(service: "s", account: "bin"), secret: binary, audit: record())
        #expect(try store.openSecret(bin).constantTimeEquals(binary))

        #expect(throws: StoreError.tooLarge) {
            try store.add(owner: 1, NewItem(service: "s", account: "over"), secret: SecureBytes(count: Limits.maxSecretBytes + 1), audit: record())
        }
        let long = String(repeating: "a", count: Limits.maxTextBytes + 1)
        #expect(throws: StoreError.tooLarge) { try store.add(owner: 1, NewItem(service: long, account: "a"), secret: secret("x"), audit: record()) }
        #expect(throws: StoreError.tooLarge) { try store.add(owner: 1, NewItem(service: "s", account: "a", label: long), secret: secret("x"), audit: record()) }
        #expect(throws: StoreError.tooLarge) { try store.item(owner: 1, service: long, account: "a") }
        #expect(throws: StoreError.invalidItem) { try store.add(owner: 1, NewItem(service: "", account: "a"), secret: secret("x"), audit: record()) }
        #expect(throws: StoreError.invalidItem) {
            try store.add(owner: 1, NewItem(service: "s", account: "r", access: AccessControl(reuseSeconds: 301)), secret: secret("x"), audit: record())
        }
        #expect(throws: StoreError.invalidItem) {
            try store.add(owner: 1, NewItem(service: "s", account: "b", access: AccessControl(policy: try Policy(parsing: "biometry-current-set"))),
                          secret: secret("x"), audit: record())
        }
        #expect(throws: StoreError.invalidItem) {
            try store.add(owner: 1, NewItem(service: "s", account: "p"), secret: secret("x"), appPassword: try sealingKey("pw"), audit: record())
        }
        // Names with NULs, quotes and non-ASCII round-trip exactly.
        let odd = NewItem(service: "s'; DROP TABLE items; --\u{0}", account: "ü\u{1F511}")
        _ = try store.add(owner: 1, odd, secret: secret("odd"), audit: record())
        let found = try #require(try store.item(owner: 1, service: odd.service, account: odd.account))
        try expectSecret(string(store.openSecret(found)), equals: "odd")
        #expect(try store.item(owner: 1, service: "s'; DROP TABLE items; --", account: odd.account) == nil)
    }

    @Test func duplicateAndPerOwnerIsolation() throws {
        let dir = TempDir()
        let store = try openStore(dir)
        let item = NewItem(service: "svc", account: "acct")
        let mine = try store.add(owner: 1000, item, secret: secret("mine"), audit: record())
        #expect(throws: StoreError.duplicate) { try store.add(owner: 1000, item, secret: secret("again"), audit: record()) }
        // The duplicate attempt left no audit entry (its transaction rolled back).
        #expect(try store.verifyAudit() == .intact(count: 1))
        // Another owner may use the same names; each sees only their own.
        let theirs = try store.add(owner: 1001, item, secret: secret("theirs"), audit: record(uid: 1001))
        #expect(mine.id != theirs.id)
        try expectSecret(string(store.openSecret(#require(try store.item(owner: 1000, service: "svc", account: "acct")))), equals: "mine")
        try expectSecret(string(store.openSecret(#require(try store.item(owner: 1001, service: "svc", account: "acct")))), equals: "theirs")
        #expect(try store.items(owner: 1000).items.map(\.id) == [mine.id])
        #expect(try store.items(owner: 1001).items.map(\.id) == [theirs.id])
        #expect(try store.items(owner: 1002).items.isEmpty)
        // A handle for another owner's item is refused.
        let renamed = NewItem(service: "svc", account: "acct2")
        let other = try store.add(owner: 1000, renamed, secret: secret("x"), audit: record())
        #expect(throws: StoreError.duplicate) { try store.replace(other, with: item, secret: secret("y"), audit: record(.update)) }
    }

    @Test func persistsAcrossReopen() throws {
        let dir = TempDir()
        var ids: [ItemID] = []
        do {
            let store = try openStore(dir)
            for i in 0..<5 {
                ids.append(try store.add(owner: 7, NewItem(service: "svc", account: "a\(i)"), secret: secret("s\(i)"), audit: record()).id)
            }
            try store.setLockout(LockoutRecord(uid: 7, failures: 5, level: 2, lockedUntil: 123_456))
            store.close()
        }
        let store = try openStore(dir)
        for i in 0..<5 {
            let item = try #require(try store.item(owner: 7, service: "svc", account: "a\(i)"))
            #expect(item.id == ids[i])
            try expectSecret(string(store.openSecret(item)), equals: "s\(i)")
        }
        #expect(try store.lockout(uid: 7) == LockoutRecord(uid: 7, failures: 5, level: 2, lockedUntil: 123_456))
        #expect(try store.lockout(uid: 8) == LockoutRecord(uid: 8))
        try store.setLockout(LockoutRecord(uid: 7))
        #expect(try store.lockout(uid: 7) == LockoutRecord(uid: 7))
        #expect(try store.verifyAudit() == .intact(count: 5))
    }

    @Test func appPasswordWrapsTheItemKey() throws {
        let dir = TempDir()
        let store = try openStore(dir)
        let access = AccessControl(policy: try Policy(parsing: "device-passcode+app-password"))
        let item = NewItem(service: "bank", account: "me", access: access)
        #expect(throws: StoreError.appPasswordRequired) { try store.add(owner: 1, item, secret: secret("x"), audit: record()) }
        #expect(throws: StoreError.invalidItem) { try sealingKey("") }
        #expect(throws: StoreError.tooLarge) { try sealingKey(String(repeating: "p", count: Limits.maxTextBytes + 1)) }
        let added = try store.add(owner: 1, item, secret: secret("vault-secret"), appPassword: try sealingKey("open sesame"), audit: record())
        #expect(added.passwordHashing != nil)
        let got = try #require(try store.item(owner: 1, service: "bank", account: "me"))
        #expect(throws: StoreError.appPasswordRequired) { try store.openSecret(got) }
        #expect(throws: StoreError.appPasswordWrong) { try store.openSecret(got, appPassword: try openingKey(got, "open sesamE")) }
        try expectSecret(string(store.openSecret(got, appPassword: openingKey(got, "open sesame"))), equals: "vault-secret")
        // A key made for other parameters (another salt: the item was sealed again since) is
        // neither right nor wrong: the caller asks again.
        #expect(throws: StoreError.conflict) { try store.openSecret(got, appPassword: try sealingKey("open sesame")) }
        #expect(StoreError.appPasswordWrong.outcome == .authenticationFailed)
    }

    @Test func biometryStateIsBound() throws {
        let dir = TempDir()
        let store = try openStore(dir)
        let digest = [UInt8](repeating: 0xab, count: 32)
        let access = AccessControl(policy: try Policy(parsing: "biometry-current-set or device-passcode"))
        let added = try store.add(owner: 1, NewItem(service: "s", account: "a", access: access, biometryState: digest),
                                  secret: secret("x"), audit: record())
        #expect(try store.item(owner: 1, service: "s", account: "a")?.biometryState == digest)
        try expectSecret(string(store.openSecret(added)), equals: "x")
        #expect(throws: StoreError.invalidItem) {
            try store.add(owner: 1, NewItem(service: "s", account: "b", access: access, biometryState: [1, 2]), secret: secret("x"), audit: record())
        }
    }

    @Test func errorDescriptionsCarryNoNames() {
        let all: [StoreError] = [.notAKeyholdDatabase, .unsupportedVersion(found: 9, known: 1), .insecurePermissions(path: "/x"),
                                 .keyFileInvalid, .io(code: 5), .duplicate, .notFound, .integrity, .appPasswordRequired,
                                 .appPasswordWrong, .tooLarge, .invalidItem, .auditWriteFailed, .closed]
        for e in all {
            #expect(!e.description.isEmpty)
            #expect(e.outcome != .ok)
        }
        #expect(StoreError.integrity.outcome == .integrityFailure)
        #expect(StoreError.auditWriteFailed.outcome == .auditUnavailable)
        #expect(StoreError.duplicate.outcome == .duplicateItem)
        #expect(StoreError.notFound.outcome == .notFound)
    }
}
