import Foundation
import Glibc
import Testing
import KeyholdTestSupport

/// Issue 13, item 1: the vault key sealed by a (software) TPM. Every step that touches a TPM
/// or a starting broker is bounded (runWithTimeout, the fixture's bounded start), so a hang
/// fails the test instead of blocking the suite.
@Suite(.serialized, .timeLimit(.minutes(5))) struct TPMProtectorTests {
    let secret = Array("tpm-sealed-secret-v1".utf8)

    func tpmArguments(_ tpm: SoftwareTPM) -> [String] { ["--key-protector", "tpm", "--tpm-tcti", tpm.tcti] }

    /// `keyholdd` run once against `stateDirectory` (expected to refuse to start), bounded.
    func startOnce(_ stateDirectory: String, _ arguments: [String], in dir: String) -> CommandResult {
        runWithTimeout(TestPaths.keyholdd, ["--state-dir", stateDirectory, "--socket", dir + "/once.sock",
                                           "--syslog-socket", dir + "/no-log"] + arguments, seconds: 60)
    }

    func files(_ directory: String) -> [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []).sorted()
    }

    @Test func opensAfterRestartButNotOnAnotherTPMOrAfterClear() throws {
        let tpm = try SoftwareTPM()
        let b = try BrokerFixture(arguments: tpmArguments(tpm))
        #expect(b.cli(["put", "svc", "acct"], stdin: secret).status == 0)
        b.stop()
        try b.start()
        #expect(b.cli(["get", "svc", "acct"]).stdout == secret)
        #expect(b.brokerLog.contains("key protector: tpm"))
        let status = b.cli(["status"])
        #expect(status.status == 0 && status.stdoutText == "key-protector=tpm rollback-detection=none\n", "\(status.stdoutText)")
        // The audit names the protector of every start.
        let audit = b.cli(["audit", "--json"]).stdoutText
        #expect(audit.contains("broker-start") && audit.contains("key-protector=tpm"), "\(audit)")
        b.stop()
        #expect(files(b.stateDirectory).contains("vault.key.tpm") && !files(b.stateDirectory).contains("vault.key"))

        // The whole state directory copied to another machine (another TPM) opens nothing.
        let copy = b.directory + "/copied"
        #expect(runCommand("/bin/cp", ["-a", b.stateDirectory, copy]).status == 0)
        let other = try SoftwareTPM()
        let elsewhere = startOnce(copy, tpmArguments(other), in: b.directory)
        #expect(elsewhere.status == 1 && elsewhere.stderr.contains("sealed by another machine's TPM"), "\(elsewhere.stderr)")
        // ... nor on a machine without a TPM, nor the file protector.
        let noTPM = startOnce(copy, ["--tpm-tcti", "swtpm:path=\(b.directory)/no-such-tpm"], in: b.directory)
        #expect(noTPM.status == 1 && noTPM.stderr.contains("no TPM answers"), "\(noTPM.stderr)")
        let asFile = startOnce(copy, ["--key-protector", "file"], in: b.directory)
        #expect(asFile.status == 1 && asFile.stderr.contains("kept by the tpm protector"), "\(asFile.stderr)")

        // The same machine after TPM2_Clear: the storage seed changed, the key is gone.
        try tpm.clear()
        let cleared = startOnce(b.stateDirectory, tpmArguments(tpm), in: b.directory)
        #expect(cleared.status == 1 && cleared.stderr.contains("TPM was cleared"), "\(cleared.stderr)")
    }

    @Test func noByteOfTheVaultKeyInTheStateDirectory() throws {
        let tpm = try SoftwareTPM()
        let b = try BrokerFixture(arguments: ["--key-protector", "file"])
        #expect(b.cli(["put", "svc", "acct"], stdin: secret).status == 0)
        #expect(b.cli(["status"]).stdoutText.hasPrefix("key-protector=file "))
        b.stop()
        // The key as the file protector kept it: what must not be on disk afterwards.
        let key = [UInt8](try Data(contentsOf: URL(fileURLWithPath: b.stateDirectory + "/vault.key")))
        #expect(b.brokerLog.contains("key protector: file: the vault key sits on disk"))
        #expect(key.count == 32)
        let migrated = runWithTimeout(TestPaths.keyholdd, ["--state-dir", b.stateDirectory, "--migrate-key-protector", "tpm",
                                                           "--tpm-tcti", tpm.tcti], seconds: 60)
        #expect(migrated.status == 0, "\(migrated.stderr)")
        #expect(files(b.stateDirectory).contains("vault.key.tpm") && !files(b.stateDirectory).contains("vault.key"))
        b.extraArguments = tpmArguments(tpm)
        try b.start()
        #expect(b.cli(["get", "svc", "acct"]).stdout == secret)
        #expect(b.cli(["status"]).stdoutText.hasPrefix("key-protector=tpm "))
        b.stop()
        // No 8-byte window of the key in any file left in the state directory (db, WAL, blob).
        let windows = Set((0...(key.count - 8)).map { Array(key[$0..<$0 + 8]) })
        for name in files(b.stateDirectory) {
            let bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: b.stateDirectory + "/" + name)))
            guard bytes.count >= 8 else { continue }
            let found = (0...(bytes.count - 8)).contains { windows.contains(Array(bytes[$0..<$0 + 8])) }
            #expect(!found, "a piece of the vault key is in \(name)")
        }
    }

    /// file → tpm → file, with kill -9 after every step of each direction: the vault opens
    /// after every interruption, and running the migration again finishes it.
    @Test func migrationSurvivesKillAtEveryStep() throws {
        let tpm = try SoftwareTPM()
        let b = try BrokerFixture(arguments: ["--tpm-tcti", tpm.tcti, "--key-protector", "file"])
        #expect(b.cli(["put", "svc", "acct"], stdin: secret).status == 0)
        b.stop()
        b.extraArguments = ["--tpm-tcti", tpm.tcti]  // auto: whatever the vault holds
        let steps = ["loaded", "temporary-written", "renamed", "audited", "removed"]
        for (target, source) in [("tpm", "file"), ("file", "tpm")] {
            let base = b.directory + "/base-\(source)"
            #expect(runCommand("/bin/cp", ["-a", b.stateDirectory, base]).status == 0)
            for step in steps {
                #expect(runCommand("/bin/rm", ["-rf", b.stateDirectory]).status == 0)
                #expect(runCommand("/bin/cp", ["-a", base, b.stateDirectory]).status == 0)
                let migrate = ["--state-dir", b.stateDirectory, "--migrate-key-protector", target, "--tpm-tcti", tpm.tcti]
                let killed = runWithTimeout(TestPaths.keyholdd, migrate, environment: ["KEYHOLD_TEST_MIGRATION_KILL_AFTER": step], seconds: 60)
                #expect(killed.status == 128 + SIGKILL, "\(target) after \(step): \(killed.status) \(killed.stderr)")
                try b.start()
                #expect(b.cli(["get", "svc", "acct"]).stdout == secret, "\(target) after \(step)")
                b.stop()
                let again = runWithTimeout(TestPaths.keyholdd, migrate, seconds: 60)
                #expect(again.status == 0, "\(target) after \(step), again: \(again.stderr)")
                let keyFiles = files(b.stateDirectory).filter { $0.hasPrefix("vault.key") }
                #expect(keyFiles == [target == "tpm" ? "vault.key.tpm" : "vault.key"], "\(target) after \(step): \(keyFiles)")
                try b.start()
                #expect(b.cli(["get", "svc", "acct"]).stdout == secret, "\(target) after \(step), finished")
                let audit = b.cli(["audit", "--json"]).stdoutText
                #expect(audit.contains("key-protector-migrate") && audit.contains("to=\(target)"))
                b.stop()
            }
        }
    }

    /// The broker unseals once at start and holds the key; a TPM that disappears later
    /// changes nothing about policy (a gated item still needs its authentication), and the
    /// next start fails closed.
    @Test func tpmDisappearingFailsClosed() throws {
        let tpm = try SoftwareTPM()
        let b = try BrokerFixture(arguments: tpmArguments(tpm))
        #expect(b.cli(["put", "gated", "x", "--policy", "device-passcode"], stdin: secret).status == 0)
        #expect(b.cli(["put", "open", "x"], stdin: Array("free".utf8)).status == 0)
        tpm.stop()
        let wrong = b.cli(["get", "gated", "x"], environment: ["KEYHOLD_ASKPASS": b.askpass(answering: "nope", name: "wrong")])
        #expect(wrong.status == 6 && wrong.stdout.isEmpty)
        let noUI = b.cli(["get", "gated", "x", "--no-interaction"])
        #expect(noUI.status != 0 && noUI.stdout.isEmpty)
        #expect(b.cli(["get", "open", "x"]).stdoutText == "free")
        b.stop()
        let restart = startOnce(b.stateDirectory, tpmArguments(tpm), in: b.directory)
        #expect(restart.status == 1 && restart.stderr.contains("no TPM answers"), "\(restart.stderr)")
        #expect(restart.stdout.isEmpty)
    }
}
