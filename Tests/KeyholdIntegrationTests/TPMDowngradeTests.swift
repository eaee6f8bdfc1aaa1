import Foundation
import Glibc
import Testing
import KeyholdCore
@testable import KeyholdVault
import KeyholdTestSupport

/// Issue 36 item 2: a vault once moved to the TPM is never served from a file key again by
/// accident. Someone who can write the state directory while the broker is down puts back a
/// backup from before `--migrate-key-protector tpm`, or only its `vault.key`, with or without
/// deleting `vault.key.tpm`; `--key-protector auto` (the shipped unit's setting) must refuse
/// (*integrity*), and the old key must open nothing of the vault as it is after the move.
@Suite(.serialized, .timeLimit(.minutes(10))) struct TPMDowngradeTests {
    func copy(_ from: String, _ to: String) {
        #expect(runCommand("/bin/rm", ["-rf", to]).status == 0)
        #expect(runCommand("/bin/cp", ["-a", from, to]).status == 0)
    }

    func startOnce(_ b: BrokerFixture, _ arguments: [String]) -> CommandResult {
        runWithTimeout(TestPaths.keyholdd, ["--state-dir", b.stateDirectory, "--socket", b.directory + "/once.sock",
                                           "--syslog-socket", b.directory + "/no-log"] + arguments, seconds: 60)
    }

    func expectRefused(_ r: CommandResult, _ what: String, sourceLocation: SourceLocation = #_sourceLocation) {
        #expect(r.status == 13 && r.stdout.isEmpty && r.stderr.contains("integrity failure"), "\(what): \(r.status) \(r.stderr)",
                sourceLocation: sourceLocation)
    }

    /// The item rows of the vault.db at `path`: id, generation, the boxes.
    typealias Row = (id: [UInt8], generation: Int64, attributes: [UInt8], wrapped: [UInt8])
    func rows(_ path: String) throws -> [Row] {
        let db = try Database(path: path, readOnly: true)
        defer { db.close() }
        return try db.withStatement("SELECT id, generation, attributes, wrapped_key FROM items") { (s) throws(DatabaseError) -> [Row] in
            var rows: [Row] = []
            while try s.step() { rows.append((s.blob(0), s.int64(1), s.blob(2), s.blob(3))) }
            return rows
        }
    }

    /// Whether `key` opens the wrapped item key or the names of any item row in `database`,
    /// for items put by root with default settings as (service, account): the associated data
    /// rebuilt from what the test put, as the store builds it.
    func opensAnything(_ key: VaultKey, _ database: String, items: [(String, String)]) throws -> [String] {
        var opened: [String] = []
        for r in try rows(database) {
            for (service, account) in items {
                let ad = AssociatedData(itemID: try #require(ItemID(bytes: r.id)), owner: 0, service: service, account: account,
                                        kind: .generic, access: AccessControl(), biometryState: nil, passwordHashing: nil,
                                        generation: UInt64(r.generation), expires: nil)
                if (try? SealedBox(combined: r.wrapped).open(using: key.wrappingKey, authenticating: ad.encoded(for: .wrappedKey))) != nil {
                    opened.append("wrapped key of \(service)")
                }
                if (try? SealedBox(combined: r.attributes).open(using: key.attributeKey, authenticating: ad.encoded(for: .attributes))) != nil {
                    opened.append("names of \(service)")
                }
            }
        }
        return opened
    }

    @Test func preMigrationCopyOrOldKeyIsRefusedAndOpensNothingNew() throws {
        let tpm = try SoftwareTPM()
        let b = try BrokerFixture(extraArguments: ["--key-protector", "file"])
        #expect(b.cli(["put", "revoked", "token"], stdin: Array("old-token".utf8)).status == 0)
        // An item whose key is wrapped twice (app password inside, vault key outside): the
        // re-key re-wraps the outer layer only, and the app password still opens it.
        let ask = b.askpass(password: "right-password", appPassword: "app-pw-1", name: "ask")
        #expect(b.cli(["put", "gated", "x", "--policy", "device-passcode+app-password"], stdin: Array("gated-v".utf8),
                      environment: ["KEYHOLD_ASKPASS": ask]).status == 0)
        b.stop()
        let backup = b.directory + "/backup"
        copy(b.stateDirectory, backup)
        let oldKey = try VaultKey(bytes: SecureBytes(copying: [UInt8](try Data(contentsOf: URL(fileURLWithPath: backup + "/vault.key")))))
        // The check below rebuilds the associated data right: the old key opens the old copy.
        #expect(try opensAnything(oldKey, backup + "/vault.db", items: [("revoked", "token")]).count == 2)

        let migrated = runWithTimeout(TestPaths.keyholdd, ["--state-dir", b.stateDirectory, "--migrate-key-protector", "tpm",
                                                           "--tpm-tcti", tpm.tcti], seconds: 60)
        #expect(migrated.status == 0 && migrated.stdout.count > 0, "\(migrated.stderr)")
        let auto = ["--key-protector", "auto", "--tpm-tcti", tpm.tcti]
        b.extraArguments = auto
        try b.start()
        // Lookups by name work under the new key; the removed token goes, a new one comes.
        expectSecret(b.cli(["get", "revoked", "token"]).stdoutText, equals: "old-token")
        expectSecret(b.cli(["get", "gated", "x"], environment: ["KEYHOLD_ASKPASS": ask]).stdoutText, equals: "gated-v")
        let wrongApp = b.cli(["get", "gated", "x"], environment: ["KEYHOLD_ASKPASS": b.askpass(password: "right-password", appPassword: "nope", name: "w")])
        #expect(wrongApp.status == 6 && wrongApp.stdout.isEmpty, "\(wrongApp.status) \(wrongApp.stderr)")
        #expect(b.cli(["rm", "revoked", "token"]).status == 0)
        #expect(b.cli(["put", "after", "move"], stdin: Array("new-token".utf8)).status == 0)
        #expect(b.cli(["ls"]).stdoutText.contains("after"))
        // The audit chain was re-MAC'd whole, and the names of entries written before the move
        // (sealed under the old attribute key) were re-sealed: they still read.
        let chain = b.cli(["audit", "verify"])
        #expect(chain.status == 0 && chain.stdoutText.hasPrefix("audit chain verified:"), "\(chain.stdoutText) \(chain.stderr)")
        let entries = b.cli(["audit", "--json"]).stdoutText.split(separator: "\n")
        #expect(entries.contains { $0.contains("\"put\"") && $0.contains("revoked") }, "\(entries)")
        b.stop()
        let current = b.directory + "/current"
        copy(b.stateDirectory, current)

        // The old key opens nothing of the vault after the move: not the item put after it, not
        // the item re-wrapped by it (had it not been removed).
        #expect(try opensAnything(oldKey, current + "/vault.db", items: [("after", "move"), ("revoked", "token")]).isEmpty)

        // (a) The backup put back as it was (no vault.key.tpm), `auto` and `file` alike.
        copy(backup, b.stateDirectory)
        expectRefused(startOnce(b, auto), "backup, auto")
        expectRefused(startOnce(b, ["--key-protector", "file", "--tpm-tcti", tpm.tcti]), "backup, file")
        // (b) The backup beside the current vault.key.tpm.
        #expect(runCommand("/bin/cp", ["-a", current + "/vault.key.tpm", b.stateDirectory + "/vault.key.tpm"]).status == 0)
        expectRefused(startOnce(b, auto), "backup with vault.key.tpm")
        #expect(FileManager.default.fileExists(atPath: b.stateDirectory + "/vault.key.tpm"), "a key file that opens another vault was removed")
        // (c) The old vault.key beside the current vault.db, vault.key.tpm deleted.
        copy(current, b.stateDirectory)
        #expect(unlink(b.stateDirectory + "/vault.key.tpm") == 0)
        #expect(runCommand("/bin/cp", ["-a", backup + "/vault.key", b.stateDirectory + "/vault.key"]).status == 0)
        let oldKeyFile = startOnce(b, auto)
        expectRefused(oldKeyFile, "old vault.key beside the current vault.db")
        #expect(oldKeyFile.stderr.contains("records that its key is sealed by the TPM"), "\(oldKeyFile.stderr)")
        // Nothing was served in any case: the current vault with its sealed key still opens.
        copy(current, b.stateDirectory)
        try b.start()
        expectSecret(b.cli(["get", "after", "move"]).stdoutText, equals: "new-token")
        #expect(b.cli(["get", "revoked", "token"]).status == 3)
        b.stop()
    }

    /// The administrator's explicit way back: `--migrate-key-protector file` on the current
    /// vault works (audited, the counter removed); run on a refused pre-migration copy it is the
    /// audited decision to serve that copy.
    @Test func explicitMigrationBackToFileWorksAndIsAudited() throws {
        let tpm = try SoftwareTPM()
        let b = try BrokerFixture(extraArguments: ["--key-protector", "file"])
        #expect(b.cli(["put", "svc", "acct"], stdin: Array("v1".utf8)).status == 0)
        b.stop()
        let backup = b.directory + "/backup"
        copy(b.stateDirectory, backup)
        let migrate = { (target: String) in
            runWithTimeout(TestPaths.keyholdd, ["--state-dir", b.stateDirectory, "--migrate-key-protector", target,
                                                "--tpm-tcti", tpm.tcti], seconds: 60)
        }
        #expect(migrate("tpm").status == 0)
        b.extraArguments = ["--key-protector", "auto", "--tpm-tcti", tpm.tcti]
        try b.start()
        #expect(b.cli(["put", "svc2", "acct"], stdin: Array("v2".utf8)).status == 0)
        b.stop()
        let index = try #require(TPMRunningBrokerTests().counterIndex(tpm))
        let back = migrate("file")
        #expect(back.status == 0, "\(back.stderr)")
        #expect(TPMRunningBrokerTests().counterIndex(tpm) == nil, "the counter \(index) is still defined")
        let keyFiles = ((try? FileManager.default.contentsOfDirectory(atPath: b.stateDirectory)) ?? []).filter { $0.hasPrefix("vault.key") }
        #expect(keyFiles == ["vault.key"], "\(keyFiles)")
        try b.start()
        expectSecret(b.cli(["get", "svc2", "acct"]).stdoutText, equals: "v2")
        #expect(b.cli(["status"]).stdoutText.hasPrefix("key-protector=file "))
        let audit = b.cli(["audit", "--json"]).stdoutText
        #expect(audit.contains("key-protector-migrate") && audit.contains("from=tpm to=file"), "\(audit)")
        b.stop()

        // Back to the TPM, then the pre-migration copy: refused, until explicitly accepted.
        #expect(migrate("tpm").status == 0)
        copy(backup, b.stateDirectory)
        #expect(throws: (any Error).self) { try b.start() }
        let accepted = migrate("file")
        #expect(accepted.status == 0, "\(accepted.stderr)")
        try b.start()
        expectSecret(b.cli(["get", "svc", "acct"]).stdoutText, equals: "v1")
        let copyAudit = b.cli(["audit", "--json"]).stdoutText
        #expect(copyAudit.contains("from=file to=file counter-removed"), "\(copyAudit)")
        b.stop()
    }

    /// The anchor file's tag is under the audit key, which the move to the TPM replaces: a kill
    /// right after the re-keyed database committed (before the anchor was written again) still
    /// leaves a vault that opens, and the anchor follows it from then on.
    @Test func anAnchoredVaultSurvivesAKillAfterTheRekey() throws {
        let tpm = try SoftwareTPM()
        let anchor = TestPaths.temporaryDirectory("kha") + "/anchor"
        let b = try BrokerFixture(extraArguments: ["--key-protector", "file", "--rollback-anchor", anchor])
        #expect(b.cli(["put", "svc", "acct"], stdin: Array("v".utf8)).status == 0)
        b.stop()
        let migrate = ["--state-dir", b.stateDirectory, "--migrate-key-protector", "tpm", "--tpm-tcti", tpm.tcti, "--rollback-anchor", anchor]
        let killed = runWithTimeout(TestPaths.keyholdd, migrate, environment: ["KEYHOLD_TEST_MIGRATION_KILL_AFTER": "committed"], seconds: 60)
        #expect(killed.status == 128 + SIGKILL, "\(killed.status) \(killed.stderr)")
        b.extraArguments = ["--key-protector", "auto", "--tpm-tcti", tpm.tcti, "--rollback-anchor", anchor]
        try b.start()
        expectSecret(b.cli(["get", "svc", "acct"]).stdoutText, equals: "v")
        #expect(b.cli(["rm", "svc", "acct"]).status == 0)
        b.stop()
        try b.start()
        #expect(b.cli(["get", "svc", "acct"]).status == 3)
        b.stop()
    }
}
