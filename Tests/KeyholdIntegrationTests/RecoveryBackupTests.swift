import Foundation
import Glibc
import Synchronization
import Testing
import KeyholdTestSupport

/// Issue 39 items 1-3: the recovery key, `keyhold backup` while the broker runs, and
/// `keyholdd --restore` on another machine (another software TPM), attacked the way a person
/// with the backup but without the right recovery key would.
@Suite(.serialized, .timeLimit(.minutes(10))) struct RecoveryBackupTests {
    func tpmArguments(_ tpm: SoftwareTPM) -> [String] { ["--key-protector", "tpm", "--tpm-tcti", tpm.tcti] }

    /// `keyholdd --create-recovery-key` with the broker stopped; the printed recovery key.
    func createRecoveryKey(_ b: BrokerFixture, _ arguments: [String] = []) -> String {
        let r = runCommand(TestPaths.keyholdd, ["--state-dir", b.stateDirectory, "--syslog-socket", b.directory + "/no-log",
                                                "--create-recovery-key"] + arguments)
        #expect(r.status == 0, "\(r.stderr)")
        let key = r.stdoutText.trimmingCharacters(in: .whitespacesAndNewlines)
        let groups = key.split(separator: "-")
        #expect(groups.count == 14 && groups.allSatisfy { $0.count == 4 && $0.allSatisfy { "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567".contains($0) } },
                "\(key)")
        return key
    }

    func restore(_ file: String, into stateDirectory: String, key: String?, _ arguments: [String]) -> CommandResult {
        runCommand(TestPaths.keyholdd, ["--state-dir", stateDirectory, "--restore", file] + arguments,
                   stdin: key.map { Array(($0 + "\n").utf8) } ?? [])
    }

    func bytes(_ path: String) -> [UInt8] { (try? [UInt8](Data(contentsOf: URL(fileURLWithPath: path)))) ?? [] }

    /// Every item as `ls --json` shows it: name → policy.
    func policies(_ b: BrokerFixture) -> [String: String] {
        var out: [String: String] = [:]
        for line in b.cli(["ls", "--json"]).stdoutText.split(separator: "\n") {
            guard let o = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any],
                  let s = o["service"] as? String, let a = o["account"] as? String, let p = o["policy"] as? String else { continue }
            out[s + "/" + a] = p
        }
        return out
    }

    @Test func recoveryKeyIsReportedShownOnceAndNeededForABackup() throws {
        let b = try BrokerFixture(extraArguments: ["--key-protector", "file"])
        #expect(b.cli(["status"]).stdoutText.hasSuffix(" recovery-key=none\n"), "\(b.cli(["status"]).stdoutText)")
        #expect(b.brokerLog.contains("recovery key: NONE"), "\(b.brokerLog)")
        // No recovery key: a backup would open nowhere, so none is written.
        let refused = b.cli(["backup", b.directory + "/early.khb"])
        #expect(refused.status != 0 && refused.stderr.contains("no recovery key"), "\(refused.stderr)")
        #expect(!FileManager.default.fileExists(atPath: b.directory + "/early.khb"))
        // Someone else than root may not back up, whatever file they name.
        let user = try TestUser(prefix: "khk")
        let other = b.cli(["backup", "/tmp/kh-not-root.khb"], asUser: user.name)
        #expect(other.status == 10, "\(other.stderr)")
        #expect(!FileManager.default.fileExists(atPath: "/tmp/kh-not-root.khb"))
        b.stop()

        let key = createRecoveryKey(b)
        // Never stored: no file of the state directory holds the written form.
        for name in try FileManager.default.contentsOfDirectory(atPath: b.stateDirectory) {
            let content = bytes(b.stateDirectory + "/" + name)
            #expect(!String(decoding: content, as: UTF8.self).contains(key.replacingOccurrences(of: "-", with: "")))
        }
        try b.start()
        #expect(b.cli(["status"]).stdoutText.hasSuffix(" recovery-key=present\n"))
        #expect(b.brokerLog.contains("recovery key: present"), "\(b.brokerLog)")
        b.stop()
        // Replacing it is audited too, and names the key it replaced.
        let second = createRecoveryKey(b)
        #expect(second != key)
        try b.start()
        let created = b.cli(["audit", "--json"]).stdoutText.split(separator: "\n").filter { $0.contains("recovery-key-create") }
        #expect(created.count == 2 && created[1].contains("replaced=") && !created[1].contains("replaced=none"), "\(created)")
        #expect(!b.cli(["audit", "--json"]).stdoutText.contains(second))
        // A backup never replaces a file, nor follows a symlink.
        symlink(b.directory + "/target", b.directory + "/link.khb")
        #expect(b.cli(["backup", b.directory + "/link.khb"]).status != 0)
        #expect(!FileManager.default.fileExists(atPath: b.directory + "/target"))
    }

    @Test func backupWhileSixteenWritersRestoresOnAnotherTPM() throws {
        let tpm = try SoftwareTPM()
        let b = try BrokerFixture(extraArguments: tpmArguments(tpm))
        b.stop()
        let key = createRecoveryKey(b, tpmArguments(tpm))
        try b.start()
        #expect(b.cli(["put", "gated", "acct", "--policy", "device-passcode"], stdin: Array("gated-secret".utf8)).status == 0)

        let backupStarted = Atomic(false)
        let log = Mutex<[(name: String, value: String, beforeBackup: Bool)]>([])
        let file = b.directory + "/vault.khb"
        let writers = 16, rounds = 6
        DispatchQueue.concurrentPerform(iterations: writers + 1) { w in
            if w == writers {
                // The backup, once the writers are under way.
                while log.withLock({ $0.count }) < writers { usleep(10_000) }
                backupStarted.store(true, ordering: .sequentiallyConsistent)
                let r = b.cli(["backup", file])
                #expect(r.status == 0, "\(r.stderr)")
                return
            }
            for k in 0..<rounds {
                // A new item each round, and one item replaced each round.
                for (service, update) in [("new-\(w)-\(k)", false), ("current-\(w)", k > 0)] {
                    let value = "\(service)=\(k)"
                    let r = b.cli(["put", service, "acct"] + (update ? ["--update"] : []), stdin: Array(value.utf8))
                    let before = !backupStarted.load(ordering: .sequentiallyConsistent)
                    if r.status == 0 { log.withLock { $0.append((service, value, before)) } }
                }
            }
        }
        let acknowledged = log.withLock { $0 }
        #expect(acknowledged.count == writers * rounds * 2)
        #expect(acknowledged.contains { $0.beforeBackup } && acknowledged.contains { !$0.beforeBackup })
        let attributes = try FileManager.default.attributesOfItem(atPath: file)
        #expect((attributes[.posixPermissions] as? Int) == 0o600 && (attributes[.ownerAccountID] as? Int) == 0, "\(attributes)")
        let audit = b.cli(["audit", "--json"]).stdoutText
        #expect(audit.contains("\"backup\"") && audit.contains("file=\(file)"), "\(audit.suffix(2000))")
        b.stop()
        // Nothing in clear: no secret written by the test is in the backup.
        let image = String(decoding: bytes(file), as: UTF8.self)
        #expect(!image.contains("gated-secret") && !image.contains("current-0=0"))

        // Another machine: another TPM, an empty state directory.
        let otherTPM = try SoftwareTPM()
        let b2 = try BrokerFixture(extraArguments: tpmArguments(otherTPM))
        b2.stop()
        try FileManager.default.removeItem(atPath: b2.stateDirectory)
        let restored = restore(file, into: b2.stateDirectory, key: key.lowercased().replacingOccurrences(of: "-", with: " "),
                               tpmArguments(otherTPM))
        #expect(restored.status == 0, "\(restored.stderr)")
        #expect(FileManager.default.fileExists(atPath: b2.stateDirectory + "/vault.key.tpm"))
        #expect(!FileManager.default.fileExists(atPath: b2.stateDirectory + "/vault.key"))
        try b2.start()
        #expect(b2.cli(["status"]).stdoutText == "key-protector=tpm rollback-detection=tpm-counter recovery-key=present\n")
        // Every item acknowledged before the backup reads back; a replaced one at least as new.
        let found = policies(b2)
        #expect(found["gated/acct"] == "device-passcode", "\(found)")
        for entry in acknowledged where entry.beforeBackup {
            if entry.name.hasPrefix("new-") {
                #expect(found[entry.name + "/acct"] == "none")
                expectSecret(b2.cli(["get", entry.name, "acct"]).stdout, equals: Array(entry.value.utf8))
            } else {
                let got = b2.cli(["get", entry.name, "acct"]).stdoutText
                let round = Int(got.split(separator: "=").last ?? "") ?? -1
                #expect(round >= Int(entry.value.split(separator: "=").last!)!, "\(entry.name): \(got)")
            }
        }
        // The chain verifies across the restore, and names the backup.
        let verify = b2.cli(["audit", "verify"])
        #expect(verify.status == 0, "\(verify.stdoutText) \(verify.stderr)")
        let chain = b2.cli(["audit", "--json"]).stdoutText
        #expect(chain.contains("\"restore\"") && chain.contains("backup=\(file)") && chain.contains("\"backup\""), "\(chain.suffix(1500))")
        // The baseline starts from the restore: a restart serves it, the counter is this TPM's.
        b2.stop()
        try b2.start()
        expectSecret(b2.cli(["get", "new-0-0", "acct"]).stdout, equals: Array("new-0-0=0".utf8))
        b2.stop()
    }

    @Test func wrongMissingOrMistypedRecoveryKeyAndAlteredBackupsCreateNothing() throws {
        let b = try BrokerFixture(extraArguments: ["--key-protector", "file"])
        #expect(b.cli(["put", "svc", "acct"], stdin: Array("kept".utf8)).status == 0)
        b.stop()
        let key = createRecoveryKey(b)
        try b.start()
        let file = b.directory + "/b.khb"
        #expect(b.cli(["backup", file]).status == 0)
        b.stop()
        // Another vault's recovery key: well formed, and not this backup's.
        let other = try BrokerFixture(extraArguments: ["--key-protector", "file"])
        other.stop()
        let otherKey = createRecoveryKey(other)

        let target = b.directory + "/restored"
        let file1 = ["--key-protector", "file", "--syslog-socket", b.directory + "/no-log"]
        let wrong = restore(file, into: target, key: otherKey, file1)
        #expect(wrong.status == 6 && wrong.stderr.contains("wrong recovery key"), "\(wrong.stderr)")
        #expect(!FileManager.default.fileExists(atPath: target))
        let none = restore(file, into: target, key: nil, file1)
        #expect(none.status != 0 && none.stderr.contains("not a recovery key"), "\(none.stderr)")
        var typo = Array(key)
        typo[5] = typo[5] == "A" ? "B" : "A"
        let mistyped = restore(file, into: target, key: String(typo), file1)
        #expect(mistyped.status == 6 && mistyped.stderr.contains("mistyped"), "\(mistyped.stderr)")
        #expect(!FileManager.default.fileExists(atPath: target))

        // One byte changed, in the database image, in the wrap, in the MAC: integrity.
        let original = bytes(file)
        for offset in [original.count / 2, 100, original.count - 1] {
            var altered = original
            altered[offset] ^= 0x01
            let path = b.directory + "/altered-\(offset).khb"
            try Data(altered).write(to: URL(fileURLWithPath: path))
            let r = restore(path, into: target, key: key, file1)
            #expect(r.status == 13 && r.stderr.contains("integrity"), "offset \(offset): \(r.stderr)")
            #expect(!FileManager.default.fileExists(atPath: target))
        }

        // Over an existing vault: refused, unless accepted (and then audited).
        let over = restore(file, into: other.stateDirectory, key: key, file1)
        #expect(over.status == 2 && over.stderr.contains("--accept-rollback"), "\(over.stderr)")
        let accepted = restore(file, into: other.stateDirectory, key: key, file1 + ["--accept-rollback"])
        #expect(accepted.status == 0, "\(accepted.stderr)")
        try other.start()
        expectSecret(other.cli(["get", "svc", "acct"]).stdout, equals: Array("kept".utf8))
        let chain = other.cli(["audit", "--json"]).stdoutText
        #expect(chain.contains("\"restore\"") && chain.contains("accept-rollback previous-state="), "\(chain.suffix(800))")
        #expect(other.cli(["audit", "verify"]).status == 0)
    }

    /// A move to the TPM gives the vault a new key: the recovery wrap of the old key must not
    /// pass for current (it would restore nothing written since), so it is reported stale and
    /// backups are refused until a new recovery key is made.
    @Test func aReKeyedVaultReportsItsRecoveryKeyStale() throws {
        let tpm = try SoftwareTPM()
        let b = try BrokerFixture(extraArguments: ["--key-protector", "file"])
        b.stop()
        _ = createRecoveryKey(b)
        let migrated = runCommand(TestPaths.keyholdd, ["--state-dir", b.stateDirectory, "--migrate-key-protector", "tpm", "--tpm-tcti", tpm.tcti])
        #expect(migrated.status == 0, "\(migrated.stderr)")
        b.extraArguments = tpmArguments(tpm)
        try b.start()
        #expect(b.cli(["status"]).stdoutText.hasSuffix(" recovery-key=stale\n"))
        #expect(b.brokerLog.contains("recovery key: STALE"))
        let refused = b.cli(["backup", b.directory + "/stale.khb"])
        #expect(refused.status != 0 && refused.stderr.contains("no longer wraps"), "\(refused.stderr)")
        b.stop()
        let key = createRecoveryKey(b, tpmArguments(tpm))
        try b.start()
        #expect(b.cli(["status"]).stdoutText.hasSuffix(" recovery-key=present\n"))
        #expect(b.cli(["backup", b.directory + "/fresh.khb"]).status == 0)
        b.stop()
        // The new recovery key opens the backup made under the new vault key (file protector here).
        let target = b.directory + "/restored"
        let r = restore(b.directory + "/fresh.khb", into: target, key: key, ["--key-protector", "file"])
        #expect(r.status == 0, "\(r.stderr)")
        #expect(FileManager.default.fileExists(atPath: target + "/vault.key"))
    }

    /// An older backup restored over the running machine's vault (same TPM, an anchor file):
    /// refused without `--accept-rollback`; accepted, it is the new baseline, so the TPM
    /// counter and the anchor, both ahead of it, do not refuse the next start.
    @Test func anOlderBackupOverTheVaultNeedsAcceptanceAndBecomesTheBaseline() throws {
        let tpm = try SoftwareTPM()
        let anchorDirectory = TestPaths.temporaryDirectory("kha")
        let anchor = ["--rollback-anchor", anchorDirectory + "/anchor"]
        let b = try BrokerFixture(extraArguments: tpmArguments(tpm) + anchor)
        b.stop()
        let key = createRecoveryKey(b, tpmArguments(tpm) + anchor)
        try b.start()
        #expect(b.cli(["put", "before", "acct"], stdin: Array("old".utf8)).status == 0)
        let file = b.directory + "/older.khb"
        #expect(b.cli(["backup", file]).status == 0)
        for i in 0..<5 { #expect(b.cli(["put", "after-\(i)", "acct"], stdin: Array("new".utf8)).status == 0) }
        b.stop()

        let refused = restore(file, into: b.stateDirectory, key: key, tpmArguments(tpm) + anchor)
        #expect(refused.status == 2, "\(refused.stderr)")
        let accepted = restore(file, into: b.stateDirectory, key: key, tpmArguments(tpm) + anchor + ["--accept-rollback"])
        #expect(accepted.status == 0, "\(accepted.stderr)")
        try b.start()
        expectSecret(b.cli(["get", "before", "acct"]).stdout, equals: Array("old".utf8))
        #expect(b.cli(["state", "after-0", "acct"]).stdoutText == "not-found\n")
        #expect(b.cli(["audit", "verify"]).status == 0)
        #expect(b.cli(["audit", "--json"]).stdoutText.contains("accept-rollback previous-state="))
        b.stop()
        // ... and it is watched from there: a copy of the restored state taken now, put back
        // after one more write, is refused like any rollback.
        let copy = b.directory + "/restored-copy"
        #expect(runCommand("/bin/cp", ["-a", b.stateDirectory, copy]).status == 0)
        try b.start()
        #expect(b.cli(["put", "later", "acct"], stdin: Array("x".utf8)).status == 0)
        b.stop()
        let rolled = runCommand(TestPaths.keyholdd, ["--state-dir", copy, "--socket", b.directory + "/once.sock",
                                                     "--syslog-socket", b.directory + "/no-log"] + tpmArguments(tpm) + anchor)
        #expect(rolled.status == 13, "\(rolled.stderr)")
    }
}
