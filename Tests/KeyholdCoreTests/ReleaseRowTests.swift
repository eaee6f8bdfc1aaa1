import Foundation
import Testing
import KeyholdCore
import KeyholdVault
import KeyholdTestSupport

/// A release's secret opened off the store lock from the row a reader read (`ReleaseRow`,
/// `SecretOpener`), and the writer's confirmation (`openConfirmed`): what was opened is given
/// out only while the stored row is byte for byte the one it came from and its generation is
/// the verified record's; any change, and the writer opens the current row with every check of
/// `openCurrentSecret` (a tightened policy is *conflict*, a replaced secret the new one, an
/// altered row *integrity*), wiping what was opened. Real SQLite files, a real reader.
@Suite struct ReleaseRowTests {
    final class Vault {
        let dir = TempDir()
        let store: VaultStore
        let reader: VaultReader
        init() throws {
            store = try openStore(dir)
            reader = try VaultReader.open(for: store)
        }
        deinit { reader.close() }

        func add(_ value: String, policy: String = "none", appPassword: AppPasswordKey? = nil) throws -> StoredItem {
            let access = AccessControl(policy: try Policy(parsing: policy))
            return try store.add(owner: 1000, NewItem(service: "svc", account: "acct", access: access), secret: secret(value),
                                 appPassword: appPassword, audit: record())
        }

        /// The reader's row and the secret opened from it, as a `get`'s session has them.
        func decided(appPassword: AppPasswordKey? = nil) throws -> (ReleaseRow, SecureBytes) {
            let row = try #require(try reader.releaseRow(owner: 1000, service: "svc", account: "acct"))
            return (row, try store.secretOpener.open(row, appPassword: appPassword))
        }

        /// `openConfirmed` on its own, or as the broker's group commit runs it: a member of a group.
        func confirm(_ row: ReleaseRow, _ opened: SecureBytes, inGroup: Bool) -> Result<(secret: SecureBytes, current: StoredItem), StoreError> {
            guard inGroup else { return Result { () throws(StoreError) in try store.openConfirmed(row, opened: opened, appPassword: nil) } }
            var result: Result<(secret: SecureBytes, current: StoredItem), StoreError> = .failure(.auditWriteFailed)
            let committed = store.groupTransaction {
                result = Result { () throws(StoreError) in
                    try store.memberTransaction { () throws(StoreError) in try store.openConfirmed(row, opened: opened, appPassword: nil) }
                }
            }
            return committed ? result : .failure(.auditWriteFailed)
        }

        /// Raw SQL on a connection of the test's own (someone who can write vault.db).
        func sql(_ text: String) throws {
            let db = try Database(path: dir.state + "/vault.db")
            defer { db.close() }
            try db.execute(text)
        }
    }

    static func isWiped(_ bytes: SecureBytes) -> Bool { bytes.constantTimeEquals(SecureBytes(count: bytes.count)) }

    @Test func anUnchangedRowReleasesWhatWasOpenedAndTheWriterOpensNothing() throws {
        let v = try Vault()
        let added = try v.add("tok-1")
        let (row, opened) = try v.decided()
        #expect(row.item == added)
        let released = try v.store.openConfirmed(row, opened: opened, appPassword: nil)
        #expect(released.secret === opened)  // the confirmation passed: not opened again
        #expect(released.current == added)
        expectSecret(string(released.secret), equals: "tok-1")
    }

    /// Replaced under the same access after the reader read it: the current row's secret (as
    /// `openCurrentSecret` gives), at its generation, and the older secret opened is wiped.
    @Test func aRowReplacedSinceReleasesTheCurrentSecretAndWipesTheOld() throws {
        let v = try Vault()
        let added = try v.add("tok-1")
        let (row, opened) = try v.decided()
        let replaced = try v.store.replace(added, with: NewItem(service: "svc", account: "acct"), secret: secret("tok-2"), audit: record(.update))
        let released = try v.store.openConfirmed(row, opened: opened, appPassword: nil)
        #expect(released.secret !== opened)
        #expect(Self.isWiped(opened))
        #expect(released.current.generation == replaced.generation)
        expectSecret(string(released.secret), equals: "tok-2")
    }

    /// The policy tightened after the gate decided on `none`: nothing is released.
    @Test func aPolicyTightenedSinceIsConflictAndWipesWhatWasOpened() throws {
        let v = try Vault()
        let added = try v.add("tok-1")
        let (row, opened) = try v.decided()
        let tightened = NewItem(service: "svc", account: "acct", access: AccessControl(policy: try Policy(parsing: "device-passcode")))
        _ = try v.store.replace(added, with: tightened, secret: secret("tok-1"), audit: record(.update))
        #expect(throws: StoreError.conflict) { try v.store.openConfirmed(row, opened: opened, appPassword: nil) }
        #expect(Self.isWiped(opened))
    }

    @Test func anItemRemovedSinceIsNotFound() throws {
        let v = try Vault()
        let added = try v.add("tok-1")
        let (row, opened) = try v.decided()
        try v.store.delete(added, audit: record(.delete))
        #expect(throws: StoreError.notFound) { try v.store.openConfirmed(row, opened: opened, appPassword: nil) }
        #expect(Self.isWiped(opened))
    }

    /// Someone who can write vault.db changes one byte of the sealed secret, or the row's
    /// generation record, after the reader read the row: the writer's confirmation fails and
    /// its own open of the current row is *integrity*; nothing opened is given out.
    @Test func aRowOrGenerationAlteredSinceIsIntegrity() throws {
        for alteration in ["UPDATE items SET secret = substr(secret, 1, length(secret) - 1) || x'00'",
                           "UPDATE items SET reuse_seconds = 5",
                           "UPDATE item_generation SET generation = generation + 1"] {
            let v = try Vault()
            _ = try v.add("tok-1")
            let (row, opened) = try v.decided()
            try v.sql(alteration)
            #expect(throws: StoreError.integrity, "\(alteration)") { try v.store.openConfirmed(row, opened: opened, appPassword: nil) }
            #expect(Self.isWiped(opened))
        }
    }

    /// The confirmation compares every column of the row and both boxes: changing any one of
    /// them after the reader read the row (to a value of the same type, or the same value as
    /// another type where that reads differently) means what was opened is not given out: the
    /// writer opens the current row itself (and here refuses it) or finds none.
    @Test func everyColumnOfTheRowIsConfirmed() throws {
        let alterations = [
            "id = randomblob(16)", "owner_uid = owner_uid + 1", "lookup = randomblob(32)", "kind = kind + 1",
            "policy = policy || ' '", "allowed_executables = allowed_executables || x'00'", "reuse_seconds = reuse_seconds + 1",
            "biometry_state = randomblob(32)", "pwhash_params = x'00'", "attributes = attributes || x'00'",
            "created_us = created_us + 1", "updated_us = updated_us + 1", "generation = generation + 1", "expires_us = 1",
            "wrapped_key = wrapped_key || x'00'", "secret = secret || x'00'", "policy = CAST(policy AS BLOB) || x'ff'",
        ]
        // Both ways the writer confirms: on its own, and as the broker does, inside a group
        // commit's write transaction, where an unchanged version stands for the comparison
        // (`ReleaseRow.readUnder`): another connection's commit must move it.
        for inGroup in [false, true] {
            for alteration in alterations {
                let v = try Vault()
                _ = try v.add("tok-1")
                let (row, opened) = try v.decided()
                try v.sql("UPDATE items SET \(alteration)")
                if case .success(let released) = v.confirm(row, opened, inGroup: inGroup) {
                    #expect(released.secret !== opened, "\(alteration), in a group: \(inGroup): the opened secret was given out")
                }
                #expect(Self.isWiped(opened), "\(alteration), in a group: \(inGroup)")
            }
            // Unchanged, the same row is confirmed (the opened secret is what is released).
            let v = try Vault()
            _ = try v.add("tok-1")
            let (row, opened) = try v.decided()
            try v.sql("UPDATE items SET policy = policy")
            #expect(try v.confirm(row, opened, inGroup: inGroup).get().secret === opened)
            let (again, openedAgain) = try v.decided()
            #expect(try v.confirm(again, openedAgain, inGroup: inGroup).get().secret === openedAgain)
        }
    }

    /// Inside one group commit, a member that changed the item before another member's release
    /// is confirmed: the writer's own uncommitted change must count as a change (the version is
    /// odd until the group ends), so the tightened policy is *conflict* and a replaced secret
    /// is the new one, never what was opened from the row read before; whether the reader read
    /// it before the group or during it (the last committed row, under the odd version).
    @Test func aChangeEarlierInTheSameGroupIsSeenByALaterMembersConfirmation() throws {
        for change in ["tighten", "replace"] {
            for readDuringGroup in [false, true] {
                let v = try Vault()
                let added = try v.add("tok-1")
                let access = AccessControl(policy: try Policy(parsing: change == "tighten" ? "device-passcode" : "none"))
                var decided = readDuringGroup ? nil : try v.decided()
                var confirmed: Result<(secret: SecureBytes, current: StoredItem), StoreError>?
                var replaced = false
                let committed = v.store.groupTransaction {
                    replaced = (try? v.store.replace(added, with: NewItem(service: "svc", account: "acct", access: access),
                                                     secret: secret("tok-2"), audit: record(.update))) != nil
                    if decided == nil { decided = try? v.decided() }
                    guard let (row, opened) = decided else { return }
                    confirmed = Result { () throws(StoreError) in
                        try v.store.memberTransaction { () throws(StoreError) in try v.store.openConfirmed(row, opened: opened, appPassword: nil) }
                    }
                }
                let what = "\(change), read during the group: \(readDuringGroup)"
                #expect(committed && replaced, "\(what)")
                let opened = try #require(decided, "\(what)").1
                #expect(Self.isWiped(opened), "\(what)")
                switch (change, confirmed) {
                case ("tighten", .failure(let e)?): #expect(e == .conflict, "\(what)")
                case ("replace", .success(let released)?): expectSecret(string(released.secret), equals: "tok-2")
                default: Issue.record("\(what): \(String(describing: confirmed))")
                }
            }
        }
    }

    /// An application-password item: the opener needs the right key (wrong: *wrong application
    /// password*, none: *required*), as the writer does; what it opened with the right key is
    /// what the writer releases.
    @Test func anAppPasswordItemOpensOnlyWithTheRightKey() throws {
        let v = try Vault()
        let added = try v.add("item-pw", policy: "device-passcode+app-password", appPassword: try sealingKey("open sesame"))
        let row = try #require(try v.reader.releaseRow(owner: 1000, service: "svc", account: "acct"))
        #expect(throws: StoreError.appPasswordRequired) { try v.store.secretOpener.open(row, appPassword: nil) }
        #expect(throws: StoreError.appPasswordWrong) { try v.store.secretOpener.open(row, appPassword: try openingKey(added, "open sesamE")) }
        let key = try openingKey(added, "open sesame")
        let (_, opened) = try v.decided(appPassword: key)
        let released = try v.store.openConfirmed(row, opened: opened, appPassword: key)
        #expect(released.secret === opened)
        expectSecret(string(released.secret), equals: "item-pw")
    }

    /// Nothing opened (the session's open failed, or there was no reader): the writer opens.
    @Test func withNothingOpenedTheWriterOpensTheRow() throws {
        let v = try Vault()
        _ = try v.add("tok-1")
        let row = try #require(try v.reader.releaseRow(owner: 1000, service: "svc", account: "acct"))
        let released = try v.store.openConfirmed(row, opened: nil, appPassword: nil)
        expectSecret(string(released.secret), equals: "tok-1")
    }
}
