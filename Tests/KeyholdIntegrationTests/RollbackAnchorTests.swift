import Foundation
import Glibc
import Testing
import KeyholdTestSupport

/// Issue 13, item 3: without a TPM, `--rollback-anchor` (the audit head also written outside
/// the state directory) catches restoring the state directory alone, and says plainly that
/// restoring the whole disk is not caught.
@Suite(.serialized, .timeLimit(.minutes(5))) struct RollbackAnchorTests {
    func startOnce(_ b: BrokerFixture, _ extra: [String]) -> CommandResult {
        runWithTimeout(TestPaths.keyholdd, ["--state-dir", b.stateDirectory, "--socket", b.directory + "/once.sock",
                                           "--syslog-socket", b.directory + "/no-log", "--pam-dir", b.pamDirectory] + extra, seconds: 60)
    }

    func copy(_ from: String, _ to: String) {
        #expect(runCommand("/bin/rm", ["-rf", to]).status == 0)
        #expect(runCommand("/bin/cp", ["-a", from, to]).status == 0)
    }

    /// A copy taken while the broker ran (idle, so the WAL is whole), one entry behind the
    /// anchor: the start must compare before it writes its own entry, or that entry would
    /// bring the copy's head up to the anchor and the removed token would be served again.
    @Test func aCopyOneEntryBehindIsRefused() throws {
        let outside = TestPaths.temporaryDirectory("kha")
        defer { try? FileManager.default.removeItem(atPath: outside) }
        let anchor = outside + "/anchor"
        let b = try BrokerFixture(extraArguments: ["--key-protector", "file", "--rollback-anchor", anchor])
        #expect(b.cli(["put", "revoked", "token"], stdin: Array("old-token".utf8)).status == 0)
        let snapshot = b.directory + "/snapshot"
        copy(b.stateDirectory, snapshot)
        #expect(b.cli(["rm", "revoked", "token"]).status == 0)  // exactly one entry
        b.stop()
        copy(snapshot, b.stateDirectory)
        let refused = startOnce(b, ["--key-protector", "file", "--rollback-anchor", anchor])
        #expect(refused.status == 13, "\(refused.status) \(refused.stderr)")
        #expect(refused.stderr.contains("the vault was restored from an older copy"), "\(refused.stderr)")
        #expect(throws: (any Error).self) { try b.start() }
        #expect(b.cli(["get", "revoked", "token"]).stdout.count == 0)
    }

    @Test func restoredStateDirectoryIsRefusedUntilAccepted() throws {
        let outside = TestPaths.temporaryDirectory("kha")
        defer { try? FileManager.default.removeItem(atPath: outside) }
        let anchor = outside + "/anchor"
        let b = try BrokerFixture(extraArguments: ["--key-protector", "file", "--rollback-anchor", anchor])
        #expect(b.brokerLog.contains("rollback of the state directory alone is detected by the anchor"))
        #expect(b.cli(["status"]).stdoutText == "key-protector=file rollback-detection=anchor-file recovery-key=none\n")
        #expect(b.cli(["put", "revoked", "token"], stdin: Array("old-token".utf8)).status == 0)
        #expect(b.cli(["put", "gated", "x", "--policy", "device-passcode"], stdin: Array("g".utf8)).status == 0)
        b.stop()
        let snapshot = b.directory + "/snapshot"
        copy(b.stateDirectory, snapshot)

        try b.start()
        #expect(b.cli(["rm", "revoked", "token"]).status == 0)
        for i in 0..<3 {
            let wrong = b.cli(["get", "gated", "x"], environment: ["KEYHOLD_ASKPASS": b.askpass(answering: "nope", name: "w\(i)")])
            #expect(wrong.status == 6)
        }
        b.stop()
        let anchorBefore = try String(contentsOfFile: anchor, encoding: .utf8)

        // Restore the older state directory: the broker refuses to serve it.
        copy(snapshot, b.stateDirectory)
        let refused = startOnce(b, ["--rollback-anchor", anchor])
        #expect(refused.status == 13, "\(refused.status) \(refused.stderr)")
        #expect(refused.stderr.contains("the vault was restored from an older copy"), "\(refused.stderr)")
        #expect(throws: (any Error).self) { try b.start() }  // nothing served: the revoked token stays unreleased
        #expect(b.cli(["get", "revoked", "token"]).stdout.count == 0)
        #expect(try String(contentsOfFile: anchor, encoding: .utf8) == anchorBefore)

        // The administrator accepts this copy: audited, re-anchored, served.
        b.extraArguments = ["--key-protector", "file", "--rollback-anchor", anchor, "--accept-rollback"]
        try b.start()
        let audit = b.cli(["audit", "--json"]).stdoutText
        #expect(audit.contains("accept-rollback"), "\(audit)")
        b.stop()
        b.extraArguments = ["--key-protector", "file", "--rollback-anchor", anchor]
        try b.start()
        expectSecret(b.cli(["get", "revoked", "token"]).stdoutText, equals: "old-token")
        b.stop()
    }

    /// What the anchor does NOT catch, shown so SECURITY.md can say it: the state directory and
    /// the anchor restored together (the whole disk) start without complaint.
    @Test func restoringTheWholeDiskIsNotCaught() throws {
        let outside = TestPaths.temporaryDirectory("kha")
        defer { try? FileManager.default.removeItem(atPath: outside) }
        let anchor = outside + "/anchor"
        let b = try BrokerFixture(extraArguments: ["--key-protector", "file", "--rollback-anchor", anchor])
        #expect(b.cli(["put", "revoked", "token"], stdin: Array("old-token".utf8)).status == 0)
        b.stop()
        copy(b.stateDirectory, b.directory + "/snapshot")
        copy(anchor, outside + "/anchor-snapshot")
        try b.start()
        #expect(b.cli(["rm", "revoked", "token"]).status == 0)
        b.stop()
        copy(b.directory + "/snapshot", b.stateDirectory)
        copy(outside + "/anchor-snapshot", anchor)
        try b.start()
        expectSecret(b.cli(["get", "revoked", "token"]).stdoutText, equals: "old-token")
        b.stop()
    }

    @Test func alteredOrForeignAnchorIsRefused() throws {
        let outside = TestPaths.temporaryDirectory("kha")
        defer { try? FileManager.default.removeItem(atPath: outside) }
        let anchor = outside + "/anchor"
        let b = try BrokerFixture(extraArguments: ["--key-protector", "file", "--rollback-anchor", anchor])
        #expect(b.cli(["put", "a", "b"], stdin: Array("v".utf8)).status == 0)
        b.stop()
        let good = try String(contentsOfFile: anchor, encoding: .utf8)
        let parts = good.split(separator: " ")
        // A lowered sequence number without the MAC, garbage, a truncated line: refused.
        for bad in ["keyhold-anchor v1 0 \(parts[3])", "garbage\n", String(good.dropLast()), good + good,
                    "keyhold-anchor v1 +\(parts[2]) \(parts[3])"] {
            try bad.write(toFile: anchor, atomically: true, encoding: .utf8)
            chmod(anchor, 0o600)
            let r = startOnce(b, ["--rollback-anchor", anchor])
            #expect(r.status == 13 && r.stderr.contains("altered, or belongs to another vault"), "\(bad): \(r.stderr)")
        }
        // Another vault's anchor.
        let other = try BrokerFixture(extraArguments: ["--rollback-anchor", outside + "/other-anchor"])
        other.stop()
        let r = startOnce(b, ["--rollback-anchor", outside + "/other-anchor"])
        #expect(r.status == 13 && r.stderr.contains("belongs to another vault"), "\(r.stderr)")
    }
}
