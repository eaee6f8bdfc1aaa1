import Foundation
import Glibc
import Testing
import KeyholdClient
import KeyholdCore
import KeyholdTestSupport

/// Issue 8, items 1–3: an unprivileged local account attacks the broker over its socket with
/// `Tests/fixtures/hostile_client.py` (the wire protocol spoken directly): it cannot deny
/// service to others, cannot grow the vault beyond its audit budget, and cannot make the
/// broker release an `--allow-exe` item to a process other than the allowed program.
@Suite(.serialized) struct HostileLocalUserTests {
    static let client = TestPaths.repository + "/Tests/fixtures/hostile_client.py"
    static let sleepExe = "/usr/bin/sleep"
    static let pythonExe = URL(fileURLWithPath: "/usr/bin/python3").resolvingSymlinksInPath().path

    /// Runs the hostile client as `user`, returning its one JSON line.
    func hostile(_ b: BrokerFixture, _ args: [String], as user: TestUser, environment: [String: String] = [:]) -> [String: Any] {
        let r = runCommand("/usr/bin/python3", [Self.client, args[0], b.socketPath] + args.dropFirst(), environment: environment,
                           asUser: user.name)
        let line = r.stdoutText.split(separator: "\n").last.map(String.init) ?? ""
        let json = (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: Any]
        if json == nil { Issue.record("hostile client \(args[0]) printed \(r.stdoutText) / \(r.stderr)") }
        return json ?? [:]
    }

    /// Starts the hostile client in the background; `wait()` returns its JSON line.
    func hostileInBackground(_ b: BrokerFixture, _ args: [String], as user: TestUser,
                             environment: [String: String] = [:]) -> () -> [String: Any] {
        let box = HostileResultBox()
        let t = Thread { box.set(self.hostile(b, args, as: user, environment: environment)) }
        t.start()
        return { box.wait() }
    }

    /// A path the unprivileged client may create, to say it is ready.
    func readyPath(_ b: BrokerFixture) -> String {
        let dir = b.directory + "/ready"
        mkdir(dir, 0o777)
        chmod(dir, 0o777)
        return dir + "/ready"
    }

    func waitForFile(_ path: String, seconds: Int = 30) -> Bool {
        for _ in 0..<(seconds * 50) {
            if access(path, F_OK) == 0 { return true }
            usleep(20_000)
        }
        return false
    }

    func auditEntries(_ b: BrokerFixture) -> [[String: Any]] {
        b.cli(["audit", "--json"]).stdoutText.split(separator: "\n")
            .compactMap { try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] }
    }

    static func milliseconds(_ body: () throws -> Void) rethrows -> Double {
        var a = timespec(), z = timespec()
        clock_gettime(CLOCK_MONOTONIC, &a)
        try body()
        clock_gettime(CLOCK_MONOTONIC, &z)
        return Double(z.tv_sec - a.tv_sec) * 1000 + Double(z.tv_nsec - a.tv_nsec) / 1e6
    }

    // MARK: item 1: no local user can deny service to others

    @Test func idleAndSlowConnectionsOfOneUserDenyNoOneElse() throws {
        let attacker = try TestUser(prefix: "kha"), other = try TestUser(prefix: "kho")
        let b = try BrokerFixture()
        let vault = Vault(socketPath: b.socketPath)
        try vault.add(SecureBytes(copying: Array("root-secret".utf8)), service: "svc", account: "root")
        #expect(b.cli(["put", "svc", "other"], stdin: Array("other-secret".utf8), asUser: other.name).status == 0)

        // 300 connections: half never send a byte, half send one a second and never finish a frame.
        let ready = readyPath(b)
        let done = hostileInBackground(b, ["idle", "300", "9"], as: attacker, environment: ["READY_FILE": ready])
        #expect(waitForFile(ready))
        usleep(300_000)
        var times: [Double] = []
        for _ in 0..<5 {
            times.append(try Self.milliseconds {
                let s = try vault.secret(service: "svc", account: "root")
                expectSecret(s.withUnsafeBytes { Array($0) }, equals: Array("root-secret".utf8))
            })
        }
        // The median within 100 ms (one get may lose the CPU to a parallel build on a loaded
        // 2-core CI machine), and none anywhere near the 5 s a starved slot would cost.
        #expect(times.sorted()[2] < 100 && times.allSatisfy { $0 < 1_000 }, "root's gets took \(times) ms")
        let theirs = b.cli(["get", "svc", "other"], asUser: other.name)
        #expect(theirs.status == 0)
        expectSecret(theirs.stdoutText, equals: "other-secret")

        // Beyond its cap the attacker was answered busy at once; the rest were closed at the
        // whole-frame deadline, the byte-a-second ones included.
        let result = done()
        #expect(result["closed_by_broker"] as? Int == 300, "\(result)")
    }

    @Test func userAtTheirCapGetsBusyExit15NotAReset() throws {
        let attacker = try TestUser(prefix: "kha")
        let b = try BrokerFixture()
        #expect(b.cli(["put", "svc", "mine"], stdin: Array("s".utf8), asUser: attacker.name).status == 0)
        let ready = readyPath(b)
        // Long-lived connections a user may hold (audit --follow), more than its cap.
        let done = hostileInBackground(b, ["follow", "40", "8"], as: attacker, environment: ["READY_FILE": ready])
        #expect(waitForFile(ready))
        let r = b.cli(["get", "svc", "mine"], asUser: attacker.name)
        #expect(r.status == 15 && r.stderr.contains("busy: too many connections from this user"), "\(r.status) \(r.stderr)")
        // Root is never starved by another uid's connections.
        #expect(b.cli(["ls"]).status == 0)
        _ = done()
        // With the attacker gone, the same user is served again.
        expectSecret(b.cli(["get", "svc", "mine"], asUser: attacker.name).stdoutText, equals: "s")
    }

    /// Three quarters of a uid's cap (24 of 32) of honest one-shot clients at once, each asking
    /// again as soon as it has its answer: a connection's slot is free the moment it closes, so
    /// none of the 600 gets is answered *busy* (before, a closed connection kept its slot while
    /// the broker waited for its next request: 612 busy in 4 s on this machine).
    @Test func honestBurstOf24OneShotClientsOfOneUidSeesNoBusy() throws {
        let user = try TestUser(prefix: "khh")
        let b = try BrokerFixture()
        #expect(b.cli(["put", "svc", "mine"], stdin: Array("s".utf8), asUser: user.name).status == 0)
        let counts = hostile(b, ["honest", "24", "25", "svc", "mine"], as: user)
        #expect(counts.keys.sorted() == ["ok"] && counts["ok"] as? Int == 600, "\(counts)")
    }

    @Test func honestBurstOf600ConnectionsSeesNoReset() throws {
        let user = try TestUser(prefix: "khb")
        let b = try BrokerFixture()
        #expect(b.cli(["put", "burst", "x"], stdin: Array("v".utf8), asUser: user.name).status == 0)
        let result = hostile(b, ["burst", "600", "burst", "x"], as: user)
        let first = result["first"] as? [String: Int] ?? [:]
        let final = result["final"] as? [String: Int] ?? [:]
        // Each of the 600 got an answer: ok, or busy beyond the uid's cap; none reset or refused.
        #expect(first["reset"] == nil && first["refused"] == nil && first["closed"] == nil, "\(result)")
        #expect((first["ok"] ?? 0) + (first["busy"] ?? 0) == 600, "\(result)")
        #expect(final == ["ok": 600], "\(result)")
    }

    // MARK: item 2: no local user can fill the disk

    func stateBytes(_ b: BrokerFixture) -> Int {
        ["vault.db", "vault.db-wal"].reduce(0) { total, name in
            var st = stat()
            return total + (stat(b.stateDirectory + "/" + name, &st) == 0 ? Int(st.st_size) : 0)
        }
    }

    @Test func requestFloodKeepsVaultGrowthWithinTheBound() throws {
        let attacker = try TestUser(prefix: "khf")
        let b = try BrokerFixture()
        try Vault(socketPath: b.socketPath).add(SecureBytes(copying: Array("r".utf8)), service: "svc", account: "root")
        b.stop()
        let before = stateBytes(b)
        try b.start()
        var counts: [String: Any] = [:]
        let seconds = Self.milliseconds {
            counts = hostile(b, ["flood", "6", "8"], as: attacker)
        } / 1000
        // Root keeps being served and audited while the attacker floods.
        expectSecret(b.cli(["get", "svc", "root"]).stdoutText, equals: "r")
        sleep(2)  // the refused-burst entry is written once the budget refills
        b.stop()
        let growth = stateBytes(b) - before
        // SECURITY.md: at most 1 MiB burst + 4 KiB/s per uid, plus the requests in flight when
        // the budget ran out (≤ 32 connections × one 8 KiB entry) and SQLite's page slack.
        let bound = (1 << 20) + Int((seconds + 3) * 4096) + 32 * 8192 + (512 << 10)
        #expect(growth <= bound, "vault grew \(growth) bytes in \(seconds) s (bound \(bound)); client saw \(counts)")
        #expect((counts["busy"] as? Int ?? 0) > 0, "\(counts)")
        try b.start()
        let bursts = auditEntries(b).filter { ($0["operation"] as? String) == "refused-burst" && ($0["uid"] as? Int) == Int(attacker.uid) }
        let counted = bursts.compactMap { ($0["reason"] as? String)?.split(separator: "=").last.flatMap { Int($0) } }.reduce(0, +)
        #expect(counted > 0 && counted == counts["busy"] as? Int, "refused-burst entries \(bursts), client \(counts)")
    }

    @Test func freeSpaceReserveRefusesItemWritesButNotAudit() throws {
        let b = try BrokerFixture()
        #expect(b.cli(["put", "svc", "kept"], stdin: Array("kept".utf8)).status == 0)
        b.stop()
        b.extraArguments = ["--free-space-reserve", "\(UInt64(1) << 60)"]  // more than any disk has free
        try b.start()
        let put = b.cli(["put", "svc", "new"], stdin: Array("n".utf8))
        #expect(put.status == 1 && put.stderr.contains("free-space reserve"), "\(put.status) \(put.stderr)")
        // A rotation ends in an item write: refused before COMMAND gets the secret (refused at
        // the end, the token COMMAND had already redeemed would be lost), the stored one stays.
        let marker = b.directory + "/rotate-ran"
        let rotate = b.cli(["rotate", "svc", "kept", "--", "/bin/sh", "-c", "touch \(marker); cat >/dev/null; printf rotated"])
        #expect(rotate.status == 1 && rotate.stderr.contains("free-space reserve"), "\(rotate.status) \(rotate.stderr)")
        #expect(!FileManager.default.fileExists(atPath: marker), "COMMAND never ran")
        // The broker's own audit writes keep working: releases go on, each with its entry.
        expectSecret(b.cli(["get", "svc", "kept"]).stdoutText, equals: "kept")
        let entries = auditEntries(b)
        #expect(entries.contains { ($0["operation"] as? String) == "get" && ($0["outcome"] as? String) == "ok" })
        #expect(entries.contains { ($0["operation"] as? String) == "put" && ($0["outcome"] as? String) == "error" })
    }

    // MARK: item 3: --allow-exe names the program that actually asks

    @Test func relayedAndPassedConnectionsAreRefusedAndAuditedWithTheRealSender() throws {
        let user = try TestUser(prefix: "khr")
        let b = try BrokerFixture()
        #expect(b.cli(["put", "allowed", "x", "--allow-exe", Self.sleepExe], stdin: Array("relay-secret".utf8), asUser: user.name).status == 0)
        #expect(b.cli(["put", "python", "x", "--allow-exe", Self.pythonExe], stdin: Array("py".utf8), asUser: user.name).status == 0)

        // The check admits the real program: python asking for its own item, alone on its connection.
        let honest = hostile(b, ["get", "python", "x"], as: user)
        #expect(honest["outcome"] as? String == "ok" && honest["released"] as? Bool == true, "\(honest)")

        var senders: [String: Int] = [:]
        for attack in ["relay", "passfd", "sendexec"] {
            let r = hostile(b, [attack, Self.sleepExe, "allowed", "x"], as: user)
            #expect(r["outcome"] as? String == "not-authorized" && r["released"] as? Bool == false, "\(attack): \(r)")
            senders[attack] = r["sender"] as? Int
        }
        expectAttacksAuditedWithTheirSenders(auditEntries(b).filter { ($0["operation"] as? String) == "get" }, senders)
        #expect(!auditEntries(b).contains { ($0["reason"] as? String).map(["relay", "passfd", "sendexec"].contains) == true
            && ($0["outcome"] as? String) == "ok" })
    }

    /// Each relay, passfd and sendexec attack has a refused `get` entry (found by its reason)
    /// naming the process that sent it: its pid, and python (the sender), never the allowed
    /// program the connector became (sendexec's sender execs, so its executable is not checked).
    func expectAttacksAuditedWithTheirSenders(_ entries: [[String: Any]], _ senders: [String: Int]) {
        for attack in ["relay", "passfd", "sendexec"] {
            let e = entries.first { ($0["reason"] as? String) == attack }
            #expect(e?["outcome"] as? String == "not-authorized", "\(attack): \(String(describing: e))")
            #expect(e?["pid"] as? Int == senders[attack], "\(attack) audited pid \(String(describing: e?["pid"])), sender \(String(describing: senders[attack]))")
            if attack != "sendexec" {
                #expect(e?["executable"] as? String == Self.pythonExe, "\(attack): \(String(describing: e))")
            }
        }
    }

    @Test func requestSentByAnotherUserOnRootsConnectionIsRefused() throws {
        let user = try TestUser(prefix: "khx")
        let b = try BrokerFixture()
        #expect(b.cli(["put", "svc", "root"], stdin: Array("root-only".utf8)).status == 0)
        // Root connects; a child that has become the test user sends the request on that connection.
        let r = runCommand("/usr/bin/python3", [Self.client, "crossuser", b.socketPath, "\(user.uid)", "svc", "root"])
        let json = (try? JSONSerialization.jsonObject(with: Data(r.stdout))) as? [String: Any] ?? [:]
        #expect(json["outcome"] as? String == "not-authorized" && json["released"] as? Bool == false, "\(r.stdoutText) \(r.stderr)")
        let e = auditEntries(b).first { ($0["reason"] as? String) == "crossuser" }
        #expect(e?["outcome"] as? String == "not-authorized" && e?["pid"] as? Int == json["sender"] as? Int, "\(String(describing: e))")
        // The entry names the user whose process sent the request, not root, whose connection it was.
        #expect(e?["uid"] as? Int == Int(user.uid), "\(String(describing: e))")
    }
}

final class HostileResultBox: @unchecked Sendable {
    private let lock = NSCondition()
    private var value: [String: Any]?
    func set(_ v: [String: Any]) { lock.lock(); value = v; lock.signal(); lock.unlock() }
    func wait() -> [String: Any] {
        lock.lock()
        defer { lock.unlock() }
        while value == nil { lock.wait() }
        return value!
    }
}
