import Foundation
import Glibc
import Testing
import KeyholdClient
import KeyholdCore
import KeyholdTestSupport

/// Issue 5, retention: `audit export --until TIME FILE` writes a file that verifies on its own
/// (`audit verify --export FILE`, checked by the broker's key) also after the entries were
/// pruned, and any edit of the file names the exact entry.
@Suite(.serialized) struct AuditExportTests {
    let secrets = ["export-secret-one", "export-secret-two"]

    /// A broker with at least six entries from root's requests.
    func populated() throws -> BrokerFixture {
        let b = try BrokerFixture()
        #expect(b.cli(["put", "github.com", "alice", "--label", "L"], stdin: Array(secrets[0].utf8)).status == 0)
        #expect(b.cli(["get", "github.com", "alice", "--reason", "sync now"]).status == 0)
        #expect(b.cli(["put", "mail", "bob"], stdin: Array(secrets[1].utf8)).status == 0)
        #expect(b.cli(["ls"]).status == 0)
        #expect(b.cli(["state", "mail", "bob"]).status == 0)
        #expect(b.cli(["get", "nope", "x"]).status == 3)
        return b
    }

    /// Audit entries as root sees them (this adds an audit-read entry of its own).
    func entries(_ b: BrokerFixture) -> [[String: Any]] {
        b.cli(["audit", "--json"]).stdoutText.split(separator: "\n").compactMap {
            try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]
        }
    }

    func lines(_ path: String) throws -> [String] {
        try String(contentsOfFile: path, encoding: .utf8).split(separator: "\n", omittingEmptySubsequences: false)
            .map(String.init).filter { !$0.isEmpty }
    }

    func write(_ lines: [String], to path: String) throws {
        unlink(path)
        try (lines.joined(separator: "\n") + "\n").write(toFile: path, atomically: false, encoding: .utf8)
    }

    /// The value of `"key":"…"` in one export line.
    func field(_ line: String, _ key: String) -> String? {
        guard let r = line.range(of: "\"\(key)\":\"") else { return nil }
        let rest = line[r.upperBound...]
        return rest.firstIndex(of: "\"").map { String(rest[..<$0]) }
    }

    func flipFirstHexDigit(_ line: String, of key: String) -> String {
        let value = field(line, key)!
        let flipped = (value.first == "0" ? "1" : "0") + value.dropFirst()
        return line.replacingOccurrences(of: "\"\(key)\":\"\(value)\"", with: "\"\(key)\":\"\(flipped)\"")
    }

    @Test func exportPruneVerifyAndTamperedFiles() throws {
        let b = try populated()
        let before = entries(b)
        // More than six: `state` asks twice (state, lockout), and the query writes its own entry.
        #expect(before.count > 6)
        let until = try #require(before[5]["time"] as? String)
        let file = b.directory + "/audit-1.jsonl"

        let export = b.cli(["audit", "export", "--until", until, file])
        #expect(export.status == 0, "\(export.stderr)")
        #expect(export.stderr.contains("exported 6 entries"))
        var st = stat()
        #expect(stat(file, &st) == 0 && st.st_mode & 0o777 == 0o600)
        let exported = try lines(file)
        #expect(exported.count == 7)
        let header = try #require(try JSONSerialization.jsonObject(with: Data(exported[0].utf8)) as? [String: Any])
        #expect(header["start_seq"] as? Int == 0 && header["through_seq"] as? Int == 6 && header["entries"] as? Int == 6)
        for (i, line) in exported.dropFirst().enumerated() {
            let row = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
            #expect(row["seq"] as? Int == i + 1)
            #expect((row["row"] as? String)?.isEmpty == false && (row["mac"] as? String)?.count == 64)
            #expect((row["prev_mac"] as? String)?.count == 64)
        }
        // Entry 1 is the broker's start (which key protector it opened the vault with).
        #expect(exported[1].contains("broker-start") && exported[1].contains("key-protector=file"))
        #expect(exported[3].contains("\"reason\":\"sync now\"") && exported[3].contains("\"service\":\"github.com\""))

        // No secret byte in the file, neither as text nor as hex.
        let text = try String(contentsOfFile: file, encoding: .utf8)
        for s in secrets {
            #expect(!text.contains(s))
            #expect(!text.contains(Array(s.utf8).map { String(format: "%02x", $0) }.joined()))
        }

        // An existing file is never overwritten.
        let again = b.cli(["audit", "export", "--until", until, file])
        #expect(again.status != 0 && again.stderr.contains("cannot create"))
        #expect(try lines(file) == exported)

        // Export, then prune the same range, then both the chain and the file verify.
        let prune = b.cli(["audit", "prune", "--until", until])
        #expect(prune.status == 0 && prune.stderr.contains("pruned 6 entries"), "\(prune.stderr)")
        let chain = b.cli(["audit", "verify"])
        #expect(chain.status == 0 && chain.stdoutText.hasPrefix("audit chain verified:"), "\(chain.stdoutText)")
        let verified = b.cli(["audit", "verify", "--export", file])
        #expect(verified.status == 0 && verified.stdoutText == "export verified: 6 entries\n", "\(verified.stdoutText)\(verified.stderr)")

        // The next export starts where the prune left its checkpoint, and verifies too.
        let file2 = b.directory + "/audit-2.jsonl"
        #expect(b.cli(["audit", "export", "--until", "now", file2]).status == 0)
        let second = try lines(file2)
        let header2 = try #require(try JSONSerialization.jsonObject(with: Data(second[0].utf8)) as? [String: Any])
        #expect(header2["start_seq"] as? Int == 6 && header2["start_mac"] as? String == field(exported[6], "mac"))
        #expect(b.cli(["audit", "verify", "--export", file2]).stdoutText.hasPrefix("export verified: "))

        // Each edit of the file names the exact entry.
        let tampered = b.directory + "/tampered.jsonl"
        func expectBroken(_ edited: [String], _ expected: String, sourceLocation: SourceLocation = #_sourceLocation) throws {
            try write(edited, to: tampered)
            let r = b.cli(["audit", "verify", "--export", tampered])
            #expect(r.status == 13, "\(r.stdoutText)\(r.stderr)", sourceLocation: sourceLocation)
            #expect(r.stdoutText == "export BROKEN at \(expected)\n", sourceLocation: sourceLocation)
        }
        var e = exported
        e[3] = e[3].replacingOccurrences(of: "\"reason\":\"sync now\"", with: "\"reason\":\"sync later\"")
        try expectBroken(e, "entry 3: readable-mismatch")
        e = exported
        e[4] = e[4].replacingOccurrences(of: "\"service\":\"mail\"", with: "\"service\":\"bank\"")
        try expectBroken(e, "entry 4: readable-mismatch")
        e = exported
        e[4] = e[4].replacingOccurrences(of: "\"uid\":0", with: "\"uid\":1000")
        try expectBroken(e, "entry 4: readable-mismatch")
        e = exported
        e[4] = flipFirstHexDigit(e[4], of: "mac")
        try expectBroken(e, "entry 4: altered")
        e = exported
        e[5] = flipFirstHexDigit(e[5], of: "row")
        try expectBroken(e, "entry 5: altered")
        e = exported
        e.remove(at: 3)
        try expectBroken(e, "entry 3: removed")
        e = exported
        e.swapAt(4, 5)
        try expectBroken(e, "entry 4: reordered")
        e = exported
        e.removeLast()
        try expectBroken(e, "entry 6: truncated-tail")
        e = exported
        e[0] = e[0].replacingOccurrences(of: "\"through_seq\":6", with: "\"through_seq\":5")
            .replacingOccurrences(of: "\"entries\":6", with: "\"entries\":5")
        e.removeLast()
        try expectBroken(e, "its header: header")
        e = exported
        e[3] = "{\"seq\":3}"
        try expectBroken(e, "line 4 (entry 3): not a valid export row")
        // An earlier bad entry is named before a later unreadable line.
        e = exported
        e[1] = flipFirstHexDigit(e[1], of: "mac")
        e[3] = "not json"
        try expectBroken(e, "entry 1: altered")
    }

    @Test func onlyRootExportsAnyoneVerifies() throws {
        let b = try populated()
        let user = try TestUser()
        let home = TestPaths.temporaryDirectory("khx")
        defer { try? FileManager.default.removeItem(atPath: home) }
        chown(home, user.uid, gid_t(getpwnam(user.name).pointee.pw_gid))

        let denied = b.cli(["audit", "export", "--until", "now", home + "/mine.jsonl"], asUser: user.name)
        #expect(denied.status == 10, "\(denied.stderr)")
        #expect(access(home + "/mine.jsonl", F_OK) != 0)  // the half-made file is removed

        let file = b.directory + "/root.jsonl"
        #expect(b.cli(["audit", "export", "--until", "now", file]).status == 0)
        let copy = home + "/copy.jsonl"
        try FileManager.default.copyItem(atPath: file, toPath: copy)
        chmod(copy, 0o644)
        let verified = b.cli(["audit", "verify", "--export", copy], asUser: user.name)
        #expect(verified.status == 0 && verified.stdoutText.hasPrefix("export verified: "), "\(verified.stdoutText)\(verified.stderr)")

        // Every answered request has its entry: the denied export, root's export, the verification.
        let ops = entries(b).map { ($0["operation"] as? String ?? "", $0["uid"] as? Int ?? -1, $0["decision"] as? String ?? "") }
        #expect(ops.contains { $0 == ("audit-export", Int(user.uid), "denied") })
        #expect(ops.contains { $0 == ("audit-export", 0, "granted") })
        #expect(ops.contains { $0 == ("audit-verify", Int(user.uid), "granted") })
    }
}
