import Foundation
import Glibc
import Testing
import KeyholdClient
import KeyholdCore
import KeyholdVault
import KeyholdTestSupport

/// Issue 5: the audit log through the real broker: one entry per request, the chain, the
/// syslog copy, failing closed on a real write fault, and who may see what.
@Suite(.serialized) struct AuditTests {
    let password = "right-password"

    func entries(_ b: BrokerFixture, _ extra: [String] = [], asUser: String? = nil) -> [[String: Any]] {
        b.cli(["audit", "--json"] + extra, asUser: asUser).stdoutText.split(separator: "\n")
            .compactMap { try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] }
    }

    @Test func everyOperationWritesExactlyOneEntry() throws {
        let b = try BrokerFixture(passwords: ["root": password])
        let ask = ["KEYHOLD_ASKPASS": b.askpass(answering: password)]
        let steps: [([String], [UInt8], [String: String], String, String, String, String)] = [
            // command, stdin, env, operation, decision, method, outcome
            (["put", "svc", "acct", "--policy", "device-passcode"], Array("audit-secret-1".utf8), [:], "put", "granted", "none", "ok"),
            (["put", "svc", "acct"], Array("x".utf8), [:], "put", "denied", "none", "duplicate-item"),
            (["get", "svc", "acct", "--reason", "because"], [], ask, "get", "granted", "password", "ok"),
            (["get", "svc", "acct", "--no-interaction"], [], [:], "get", "denied", "none", "interaction-not-allowed"),
            (["put", "svc", "acct", "--update"], Array("audit-secret-2".utf8), ask, "update", "granted", "password", "ok"),
            (["state", "svc", "acct"], [], [:], "state", "granted", "none", "ok"),
            (["ls"], [], [:], "list", "granted", "none", "ok"),
            (["lock"], [], [:], "lock", "granted", "none", "ok"),
            (["biometry"], [], [:], "biometry", "granted", "none", "ok"),
            (["get", "nothing", "here"], [], [:], "get", "denied", "none", "not-found"),
            (["rm", "svc", "acct"], [], [:], "delete", "granted", "none", "ok"),
            (["audit", "verify"], [], [:], "audit-verify", "granted", "none", "ok"),
        ]
        for (cmd, stdin, env, _, _, _, _) in steps { b.cli(cmd, stdin: stdin, environment: env) }
        // The broker's start comes first (the key protector it opened the vault with).
        let all = entries(b)
        #expect(all.first?["operation"] as? String == "broker-start" && (all.first?["reason"] as? String)?.hasPrefix("key-protector=") == true)
        let rows = Array(all.dropFirst())
        // The last row is the `audit` query that produced the listing.
        #expect(rows.count == steps.count + 1, "\(rows.count) rows")
        for (i, step) in steps.enumerated() where i < rows.count {
            let r = rows[i]
            #expect(r["operation"] as? String == step.3, "step \(i) \(step.0)")
            #expect(r["decision"] as? String == step.4, "step \(i) \(step.0)")
            #expect(r["method"] as? String == step.5, "step \(i) \(step.0)")
            #expect(r["outcome"] as? String == step.6, "step \(i) \(step.0)")
            #expect(r["uid"] as? Int == 0)
            #expect((r["executable"] as? String)?.hasSuffix("/keyhold") == true)
            #expect((r["seq"] as? Int) == i + 2)  // after the start entry
        }
        #expect(rows[2]["reason"] as? String == "because")
        #expect(rows[2]["service"] as? String == "svc" && rows[2]["account"] as? String == "acct")
        #expect((rows[2]["item_id"] as? String)?.count == 32)
        #expect(rows.last?["operation"] as? String == "audit-read")
        // The chain over all of it verifies.
        let v = b.cli(["audit", "verify"])
        #expect(v.status == 0 && v.stdoutText.contains("verified: \(steps.count + 2) entries"), "\(v.stdoutText)")
        // The table view works too.
        #expect(b.cli(["audit"]).stdoutText.contains("OPERATION"))

        // No secret or password anywhere: not in the table's raw bytes, the WAL, or syslog.
        b.stop()
        for file in try FileManager.default.contentsOfDirectory(atPath: b.stateDirectory) {
            let data = try Data(contentsOf: URL(fileURLWithPath: b.stateDirectory + "/" + file))
            for s in ["audit-secret-1", "audit-secret-2", password, "because"] {
                #expect(data.range(of: Data(s.utf8)) == nil, "\(s) in \(file)")
            }
        }
        let log = b.syslogLines
        // The broker's start, every step, the JSON listing, the verify and the table listing above.
        #expect(log.count == steps.count + 4, "\(log.count) syslog lines")
        #expect(log.first?.contains("op=broker-start") == true, "\(log.first ?? "")")
        #expect(log.allSatisfy { $0.hasPrefix("<86>") && $0.contains("keyholdd[") && $0.contains(" audit op=") })
        for s in ["audit-secret", password, "because", "svc", "acct"] {
            #expect(!log.joined().contains(s), "\(s) in syslog")
        }
    }

    @Test func concurrentClientsEachGetOneEntryInOrder() throws {
        let b = try BrokerFixture()
        let vault = Vault(socketPath: b.socketPath)
        let threads = (0..<16).map { t in
            Thread {
                for i in 0..<10 {
                    try? vault.add(SecureBytes(copying: Array("v\(t)-\(i)".utf8)), service: "c\(t)", account: "n\(i)")
                    _ = try? vault.secret(service: "c\(t)", account: "n\(i)")
                }
            }
        }
        threads.forEach { $0.start() }
        while threads.contains(where: { !$0.isFinished }) { usleep(2000) }
        let rows = entries(b)
        let seqs = rows.compactMap { $0["seq"] as? Int }
        #expect(seqs == Array(1...seqs.count))
        #expect(rows.filter { $0["operation"] as? String == "put" && $0["outcome"] as? String == "ok" }.count == 160)
        #expect(rows.filter { $0["operation"] as? String == "get" && $0["outcome"] as? String == "ok" }.count == 160)
        for t in 0..<16 {
            let mine = rows.filter { $0["service"] as? String == "c\(t)" }
            #expect(mine.count == 20)
        }
        #expect(b.cli(["audit", "verify"]).status == 0)
    }

    @Test func verifyNamesAnEditedEntry() throws {
        let b = try BrokerFixture()
        for i in 0..<5 { b.cli(["put", "s\(i)", "a"], stdin: [1]) }
        b.stop()
        let db = try Database(path: b.stateDirectory + "/vault.db")
        try db.execute("UPDATE audit SET outcome = 'not-found' WHERE seq = 3")
        db.close()
        try b.start()
        let v = b.cli(["audit", "verify"])
        #expect(v.status == 13)
        #expect(v.stdoutText.contains("entry 3") && v.stdoutText.contains("altered"), "\(v.stdoutText)")
    }

    /// A real write fault: the broker's file-size limit drops to 1 byte, so SQLite cannot write
    /// the audit entry. Nothing is released; once the limit is restored the broker serves again.
    @Test func failsClosedWhenTheAuditCannotBeWritten() throws {
        let b = try BrokerFixture()
        #expect(b.cli(["put", "fc", "x"], stdin: Array("fail-closed-secret".utf8)).status == 0)
        expectSecret(b.cli(["get", "fc", "x"]).stdoutText, equals: "fail-closed-secret")
        let countBefore = entries(b).count

        #expect(runCommand("/usr/bin/prlimit", ["--pid", "\(b.pid)", "--fsize=1:unlimited"]).status == 0)
        let get = b.cli(["get", "fc", "x"])
        #expect(get.status == 12 && get.stdout.isEmpty, "\(get.stderr)")
        #expect(get.stderr.contains("audit"))
        let put = b.cli(["put", "fc2", "x"], stdin: Array("other".utf8))
        #expect(put.status == 12)

        #expect(runCommand("/usr/bin/prlimit", ["--pid", "\(b.pid)", "--fsize=unlimited:unlimited"]).status == 0)
        #expect(b.process?.isRunning == true)
        expectSecret(b.cli(["get", "fc", "x"]).stdoutText, equals: "fail-closed-secret")
        #expect(b.cli(["state", "fc2", "x"]).stdoutText == "not-found\n")   // the refused put left nothing
        let after = entries(b)
        // The refused requests left no "granted" entry behind.
        #expect(!after.dropFirst(countBefore).contains { $0["operation"] as? String == "get" && $0["outcome"] as? String != "ok" && $0["decision"] as? String == "granted" })
        #expect(b.cli(["audit", "verify"]).status == 0)
        #expect(b.syslogLines.contains { $0.contains("audit-unavailable") })
    }

    @Test func usersSeeOnlyTheirOwnEntries() throws {
        let user = try TestUser()
        let b = try BrokerFixture()
        b.cli(["put", "root-item", "x"], stdin: [1])
        b.cli(["put", "user-item", "x"], stdin: [2], asUser: user.name)
        b.cli(["get", "user-item", "x"], asUser: user.name)
        let mine = entries(b, asUser: user.name)
        #expect(!mine.isEmpty)
        #expect(mine.allSatisfy { $0["uid"] as? Int == Int(user.uid) })
        #expect(!mine.contains { $0["service"] as? String == "root-item" })
        let all = entries(b)
        #expect(all.contains { $0["service"] as? String == "user-item" } && all.contains { $0["service"] as? String == "root-item" })
        // Pruning is root's alone.
        let prune = b.cli(["audit", "prune", "--until", "now"], asUser: user.name)
        #expect(prune.status == 10)
        // The broker's reason reaches the user, not a generic line about item policies.
        #expect(prune.stderr.contains("not authorized: only root may prune the audit log"), "\(prune.stderr)")
    }

    @Test func sinceItemAndFollow() throws {
        let b = try BrokerFixture()
        b.cli(["put", "old", "x"], stdin: [1])
        usleep(20_000)
        let cut = Int64(Date().timeIntervalSince1970 * 1_000_000)
        usleep(20_000)
        b.cli(["put", "new", "x"], stdin: [1])
        let since = entries(b, ["--since", "@\(cut / 1_000_000)"])
        #expect(!since.isEmpty)
        let recent = entries(b, ["--since", isoTime(cut)])
        #expect(recent.contains { $0["service"] as? String == "new" } && !recent.contains { $0["service"] as? String == "old" })
        #expect(entries(b, ["--item", "old/x"]).count == 1)
        #expect(b.cli(["audit", "--since", "yesterday"]).status == 2)

        // --follow: new entries appear while it runs.
        let p = Process()
        p.executableURL = URL(fileURLWithPath: TestPaths.keyhold)
        p.arguments = ["--socket", b.socketPath, "audit", "--json", "--follow", "--item", "live/x"]
        let out = Pipe()
        p.standardOutput = out
        try p.run()
        usleep(300_000)
        b.cli(["put", "live", "x"], stdin: [1])
        b.cli(["get", "live", "x"])
        var text = ""
        let reader = out.fileHandleForReading
        for _ in 0..<50 where text.split(separator: "\n").count < 2 {
            usleep(100_000)
            text += String(decoding: reader.availableData, as: UTF8.self)
        }
        p.interrupt()
        p.waitUntilExit()
        #expect(text.split(separator: "\n").count == 2, "\(text)")
        #expect(text.contains("\"operation\":\"put\"") && text.contains("\"operation\":\"get\""))
    }
}

func isoTime(_ micros: Int64) -> String {
    do {
        let d = Date(timeIntervalSince1970: Double(micros) / 1_000_000)
        let f = ISO8601DateFormatter()
        f.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        return f.string(from: d)
    }
}
