import Foundation
import Glibc
import Testing
import KeyholdClient
import KeyholdCore
import KeyholdVault
import KeyholdTestSupport

/// Issue 2: the sealed store, the broker and the CLI, end to end over the real socket.
@Suite(.serialized) struct StoreThroughBrokerTests {
    func secret(_ s: String) -> SecureBytes { SecureBytes(copying: Array(s.utf8)) }
    func bytes(_ s: SecureBytes) -> [UInt8] { s.withUnsafeBytes { Array($0) } }

    @Test func roundTripTextBinaryEmptyAndTooLarge() throws {
        let b = try BrokerFixture()
        let vault = Vault(socketPath: b.socketPath)
        try vault.add(secret("gho_text-token"), service: "github.com", account: "alice", kind: .refreshToken)
        try expectSecret(bytes(vault.secret(service: "github.com", account: "alice")), equals: Array("gho_text-token".utf8))

        let binary = (0...255).map(UInt8.init) + [0, 0, 10, 13]
        #expect(b.cli(["put", "bin", "x"], stdin: binary).status == 0)
        let got = b.cli(["get", "bin", "x"])
        #expect(got.status == 0 && got.stderr.isEmpty)
        expectSecret(got.stdout, equals: binary)

        // An empty secret is accepted and read back as empty (documented in the README).
        #expect(b.cli(["put", "empty", "x"], stdin: []).status == 0)
        let empty = b.cli(["get", "empty", "x"])
        #expect(empty.status == 0)
        expectSecret(empty.stdoutText, equals: "")

        let max = [UInt8](repeating: 0x41, count: Limits.maxSecretBytes)
        #expect(b.cli(["put", "max", "x"], stdin: max).status == 0)
        expectSecret(b.cli(["get", "max", "x"]).stdout, equals: max)
        let over = b.cli(["put", "over", "x"], stdin: max + [0x41])
        #expect(over.status == 2 && over.stderr.contains("65536-byte limit"))
        #expect(b.cli(["state", "over", "x"]).stdoutText == "not-found\n")
    }

    @Test func duplicateUpdateDelete() throws {
        let b = try BrokerFixture()
        #expect(b.cli(["put", "svc", "acct", "--label", "first"], stdin: Array("one".utf8)).status == 0)
        let dup = b.cli(["put", "svc", "acct"], stdin: Array("two".utf8))
        #expect(dup.status == 4)
        #expect(dup.stderr.hasPrefix("keyhold: ") && dup.stderr.split(separator: "\n").count == 1)
        expectSecret(b.cli(["get", "svc", "acct"]).stdoutText, equals: "one")
        #expect(b.cli(["put", "svc", "acct", "--update", "--label", "second"], stdin: Array("two".utf8)).status == 0)
        expectSecret(b.cli(["get", "svc", "acct"]).stdoutText, equals: "two")
        #expect(b.cli(["ls"]).stdoutText.contains("second"))
        #expect(b.cli(["rm", "svc", "acct"]).status == 0)
        #expect(b.cli(["get", "svc", "acct"]).status == 3)
        #expect(b.cli(["rm", "svc", "acct"]).status == 3)
        #expect(b.cli(["state", "svc", "acct"]).stdoutText == "not-found\n")
    }

    @Test func listAndStateNeverShowSecrets() throws {
        let b = try BrokerFixture()
        #expect(b.cli(["put", "a.example", "u1", "--kind", "password", "--label", "L1"], stdin: Array("sekrit-1".utf8)).status == 0)
        #expect(b.cli(["put", "b.example", "u2", "--policy", "device-passcode"], stdin: Array("sekrit-2".utf8)).status == 0)
        let ls = b.cli(["ls"])
        #expect(ls.status == 0 && ls.stdoutText.contains("a.example") && ls.stdoutText.contains("device-passcode"))
        let json = b.cli(["ls", "--json"])
        #expect(json.stdoutText.split(separator: "\n").count == 2)
        for line in json.stdoutText.split(separator: "\n") {
            #expect((try? JSONSerialization.jsonObject(with: Data(line.utf8))) != nil)
        }
        #expect(!ls.stdoutText.contains("sekrit") && !json.stdoutText.contains("sekrit"))
        #expect(b.cli(["state", "a.example", "u1"]).stdoutText == "available\n")
        #expect(b.cli(["state", "b.example", "u2"]).stdoutText == "requires-authentication\n")
    }

    @Test func brokerIsHardenedAndStopsCleanly() throws {
        let b = try BrokerFixture()
        let environ = try Data(contentsOf: URL(fileURLWithPath: "/proc/\(b.pid)/environ"))
        #expect(environ.split(separator: 0).contains { String(decoding: $0, as: UTF8.self) == "SWIFT_BACKTRACE=enable=no" })
        let limits = try String(contentsOfFile: "/proc/\(b.pid)/limits", encoding: .utf8)
        let core = limits.split(separator: "\n").first { $0.hasPrefix("Max core file size") } ?? ""
        #expect(core.split(whereSeparator: \.isWhitespace).suffix(3) == ["0", "0", "bytes"])
        let p = try #require(b.process)
        b.stop()
        #expect(p.terminationReason == .exit && p.terminationStatus == 0)
        #expect(!FileManager.default.fileExists(atPath: b.socketPath))
        // A stale socket file left by a killed broker does not stop the next one.
        try b.start()
        b.kill9()
        #expect(FileManager.default.fileExists(atPath: b.socketPath))
        try b.start()
        #expect(b.cli(["ls"]).status == 0)
    }

    @Test func persistsAcrossRestartsAndSurvivesKill9() throws {
        let b = try BrokerFixture()
        let vault = Vault(socketPath: b.socketPath)
        try vault.add(secret("before-restart"), service: "s", account: "a")
        b.stop()
        try b.start()
        try expectSecret(bytes(vault.secret(service: "s", account: "a")), equals: Array("before-restart".utf8))

        // A stream of puts; every acknowledged one must be there after kill -9.
        let acknowledged = Counter()
        let writer = Thread {
            for i in 0..<100_000 {
                do {
                    try vault.add(SecureBytes(copying: Array("value-\(i)".utf8)), service: "stream", account: "n\(i)")
                    acknowledged.set(i + 1)
                } catch { return }
            }
        }
        writer.start()
        while acknowledged.value < 50 { usleep(2000) }
        b.kill9()
        while !writer.isFinished { usleep(1000) }
        let acked = acknowledged.value
        try b.start()
        let db = try Database(path: b.stateDirectory + "/vault.db")
        #expect(try db.pragma("integrity_check") == "ok")
        db.close()
        for i in 0..<acked {
            try expectSecret(bytes(vault.secret(service: "stream", account: "n\(i)")), equals: Array("value-\(i)".utf8))
        }
        #expect(acked >= 50)
    }

    /// Rows edited on disk never open: the read fails with the integrity outcome (exit 13) and
    /// every other item still reads.
    @Test(arguments: ["flip", "swap-secrets", "policy", "swap-keys", "swap-lookup"])
    func tamperedRowsFailIntegrity(_ tamper: String) throws {
        let b = try BrokerFixture()
        for name in ["victim", "other", "third"] {
            // The policy edit is tried on a gated item: it must not open it without the prompt.
            let policy = name == "victim" && tamper == "policy" ? "device-passcode" : "none"
            #expect(b.cli(["put", name, "acct", "--policy", policy],
                          stdin: Array("secret-of-\(name)".utf8)).status == 0)
        }
        b.stop()
        let db = try Database(path: b.stateDirectory + "/vault.db")
        let ids: [[UInt8]] = try db.withStatement("SELECT id FROM items ORDER BY created_us") { st throws(DatabaseError) in
            var out: [[UInt8]] = []
            while try st.step() { out.append(st.blob(0)) }
            return out
        }
        let victim = ids[0], other = ids[1]
        func swap(_ column: String) throws {
            // Through a placeholder, so a UNIQUE column can be swapped too.
            try db.execute("""
                CREATE TEMP TABLE held AS SELECT id, \(column) AS v FROM items WHERE id IN (x'\(hex(victim))', x'\(hex(other))');
                UPDATE items SET \(column) = x'00' WHERE id = x'\(hex(victim))';
                UPDATE items SET \(column) = x'01' WHERE id = x'\(hex(other))';
                UPDATE items SET \(column) = (SELECT v FROM held WHERE id = x'\(hex(other))') WHERE id = x'\(hex(victim))';
                UPDATE items SET \(column) = (SELECT v FROM held WHERE id = x'\(hex(victim))') WHERE id = x'\(hex(other))';
                DROP TABLE held;
                """)
        }
        switch tamper {
        case "flip":
            let flipped: [UInt8] = try db.withStatement("SELECT secret FROM items WHERE id = x'\(hex(victim))'") { st throws(DatabaseError) in
                _ = try st.step(); return st.blob(0)
            }
            var raw = flipped
            raw[raw.count / 2] ^= 0x01
            try db.withStatement("UPDATE items SET secret = ? WHERE id = ?") { st throws(DatabaseError) in
                try st.bind(1, blob: raw); try st.bind(2, blob: victim); _ = try st.step()
            }
        case "swap-secrets": try swap("secret")
        case "policy": try db.execute("UPDATE items SET policy = 'none' WHERE id = x'\(hex(victim))'")
        case "swap-keys": try swap("wrapped_key")
        case "swap-lookup": try swap("lookup")
        default: Issue.record("unknown tamper")
        }
        db.close()
        try b.start()
        let got = b.cli(["get", "victim", "acct", "--no-interaction"])
        #expect(got.status == 13, "\(tamper): \(got.stderr)")
        #expect(got.stdout.count == 0)
        #expect(got.stderr.contains("integrity"))
        if tamper.hasPrefix("swap") {
            // The other half of a swap fails too: never the wrong secret.
            let o = b.cli(["get", "other", "acct"])
            #expect(o.status == 13 && o.stdout.isEmpty, "\(tamper) other: \(o.stderr)")
        } else {
            expectSecret(b.cli(["get", "other", "acct"]).stdoutText, equals: "secret-of-other")
        }
        expectSecret(b.cli(["get", "third", "acct"]).stdoutText, equals: "secret-of-third")
        // A damaged item can be removed by its owner and stored again; nothing else is touched.
        // Where its policy itself cannot be read (names or policy altered), after their password.
        if ["policy", "swap-lookup"].contains(tamper) {
            #expect(b.cli(["rm", "victim", "acct"]).status == 7)
            #expect(b.cli(["rm", "victim", "acct"], environment: ["KEYHOLD_ASKPASS": b.askpass(answering: "right-password")]).status == 0)
        } else {
            #expect(b.cli(["rm", "victim", "acct"]).status == 0)
        }
        #expect(b.cli(["state", "victim", "acct"]).stdoutText == "not-found\n")
        #expect(b.cli(["put", "victim", "acct"], stdin: Array("fresh".utf8)).status == 0)
        expectSecret(b.cli(["get", "victim", "acct"]).stdoutText, equals: "fresh")
        expectSecret(b.cli(["get", "third", "acct"]).stdoutText, equals: "secret-of-third")
    }

    @Test func nothingInPlaintextInTheStateDirectory() throws {
        let b = try BrokerFixture()
        let names = ["plain-service-name-XYZ", "plain-account-name-QRS", "plain-label-LMN", "plain-secret-value-JKL", "plain-reason-OPQ"]
        #expect(b.cli(["put", names[0], names[1], "--label", names[2]], stdin: Array(names[3].utf8)).status == 0)
        #expect(b.cli(["get", names[0], names[1], "--reason", names[4]]).status == 0)
        #expect(b.cli(["put", names[0], names[1], "--update"], stdin: Array((names[3] + "2").utf8)).status == 0)
        for file in try FileManager.default.contentsOfDirectory(atPath: b.stateDirectory) {
            let data = try Data(contentsOf: URL(fileURLWithPath: b.stateDirectory + "/" + file))
            for n in names { #expect(data.range(of: Data(n.utf8)) == nil, "\(n) in \(file)") }
        }
        var st = stat()
        #expect(stat(b.stateDirectory, &st) == 0 && st.st_mode & 0o777 == 0o700)
        #expect(stat(b.stateDirectory + "/vault.key", &st) == 0 && st.st_mode & 0o777 == 0o600)
        #expect(stat(b.stateDirectory + "/vault.db", &st) == 0 && st.st_mode & 0o077 == 0)
    }

    @Test func refusesInsecureOrForeignStateDirectories() throws {
        let b = try BrokerFixture()
        b.stop()
        chmod(b.stateDirectory, 0o755)
        let open = runCommand(TestPaths.keyholdd, ["--state-dir", b.stateDirectory, "--socket", b.directory + "/x.sock"])
        #expect(open.status != 0 && open.stderr.contains(b.stateDirectory))
        chmod(b.stateDirectory, 0o700)
        let keyBefore = try Data(contentsOf: URL(fileURLWithPath: b.stateDirectory + "/vault.key"))
        chmod(b.stateDirectory + "/vault.key", 0o644)
        #expect(runCommand(TestPaths.keyholdd, ["--state-dir", b.stateDirectory, "--socket", b.directory + "/x.sock"]).status != 0)
        chmod(b.stateDirectory + "/vault.key", 0o600)
        expectSecret(try Data(contentsOf: URL(fileURLWithPath: b.stateDirectory + "/vault.key")), equals: keyBefore)

        let foreign = TestPaths.temporaryDirectory("khf")
        defer { try? FileManager.default.removeItem(atPath: foreign) }
        chmod(foreign, 0o700)
        try Data("not a database at all".utf8).write(to: URL(fileURLWithPath: foreign + "/vault.db"))
        let r = runCommand(TestPaths.keyholdd, ["--state-dir", foreign, "--socket", foreign + "/x.sock"])
        #expect(r.status != 0)
        #expect(try Data(contentsOf: URL(fileURLWithPath: foreign + "/vault.db")) == Data("not a database at all".utf8))
        try b.start()
    }

    /// keyholdd executes keyhold-pam-helper as root: a missing helper, or one another user
    /// could have replaced, stops it at start-up, before the vault is opened.
    @Test func refusesAMissingOrWritablePAMHelper() throws {
        let b = try BrokerFixture()
        b.stop()
        let bin = TestPaths.temporaryDirectory("khbin")
        defer { try? FileManager.default.removeItem(atPath: bin) }
        chmod(bin, 0o755)
        try copyProgram(TestPaths.keyholdd, to: bin + "/keyholdd")
        let args = ["--state-dir", b.stateDirectory, "--socket", b.directory + "/x.sock"]
        let missing = runCommand(bin + "/keyholdd", args)
        #expect(missing.status != 0 && missing.stderr.contains("keyhold-pam-helper must be installed beside keyholdd"), "\(missing.stderr)")
        try copyProgram(TestPaths.pamHelper, to: bin + "/keyhold-pam-helper")
        chmod(bin + "/keyhold-pam-helper", 0o775)
        let writable = runCommand(bin + "/keyholdd", args)
        #expect(writable.status != 0 && writable.stderr.contains("writable by another user"), "\(writable.stderr)")
        chmod(bin + "/keyhold-pam-helper", 0o755)
        chmod(bin, 0o777)
        let openDirectory = runCommand(bin + "/keyholdd", args)
        #expect(openDirectory.status != 0 && openDirectory.stderr.contains("its directory is writable"), "\(openDirectory.stderr)")
        try b.start()
        #expect(b.cli(["ls"]).status == 0)
    }

    @Test func hostileFramesLeaveTheBrokerServing() throws {
        let b = try BrokerFixture()
        #expect(b.cli(["put", "keep", "me"], stdin: Array("intact".utf8)).status == 0)
        let garbage: [[UInt8]] = [
            Array("GET / HTTP/1.1\r\n\r\n".utf8),            // not a frame
            [0x7f, 0xff, 0xff, 0xff],                       // oversized length
            [0, 0, 0, 50, 1, 1, 1],                         // truncated
            [0, 0, 0, 2, 9, 1],                             // wrong protocol version
            [0, 0, 0, 7, 1, 1, 99, 0, 0, 0, 0],            // unknown field
            [],                                             // connect and leave
        ]
        for g in garbage {
            let reply = rawExchange(b.socketPath, g)
            // Either an error frame or a closed connection; never a crash.
            if !reply.isEmpty { #expect(reply.count >= 6) }
        }
        expectSecret(b.cli(["get", "keep", "me"]).stdoutText, equals: "intact")
        #expect(b.process?.isRunning == true)
    }

    @Test func sixtyFourConcurrentClients() throws {
        let b = try BrokerFixture()
        let vault = Vault(socketPath: b.socketPath)
        let failures = Counter()
        let threads = (0..<64).map { t in
            Thread {
                for i in 0..<10 {
                    let value = "v-\(t)-\(i)"
                    do {
                        try vault.add(SecureBytes(copying: Array(value.utf8)), service: "c\(t)", account: "n\(i)")
                        let back = try vault.secret(service: "c\(t)", account: "n\(i)")
                        if back.withUnsafeBytes({ Array($0) }) != Array(value.utf8) { failures.add() }
                    } catch { failures.add() }
                }
            }
        }
        threads.forEach { $0.start() }
        while threads.contains(where: { !$0.isFinished }) { usleep(2000) }
        #expect(failures.value == 0)
        #expect(try vault.items().count == 640)
    }

    @Test func exitCodesAndHelp() throws {
        let b = try BrokerFixture()
        for cmd in [["put"], ["get"], ["rm"], ["ls"], ["state"], ["lock"], ["biometry"], ["audit"], ["audit", "verify"],
                    ["audit", "export"], ["audit", "prune"], ["demo"]] {
            let r = runCommand(TestPaths.keyhold, cmd + ["--help"])
            #expect(r.status == 0 && r.stdoutText.hasPrefix("usage: keyhold \(cmd.joined(separator: " "))"), "\(cmd)")
        }
        #expect(runCommand(TestPaths.keyhold, ["--help"]).stdoutText.contains("commands:"))
        #expect(runCommand(TestPaths.keyhold, []).status == 2)
        #expect(b.cli(["bogus"]).status == 2)
        #expect(b.cli(["get", "only-one"]).status == 2)
        let badPolicy = b.cli(["put", "s", "a", "--policy", "biometry-sometimes"], stdin: [1])
        #expect(badPolicy.status == 2 && badPolicy.stderr.contains("biometry-sometimes"))
        #expect(b.cli(["get", "nothing", "here"]).status == 3)
        let gone = runCommand(TestPaths.keyhold, ["--socket", b.directory + "/none.sock", "ls"])
        #expect(gone.status == 11 && gone.stderr.split(separator: "\n").count == 1)
        let env = runCommand(TestPaths.keyhold, ["ls"], environment: ["KEYHOLD_SOCKET": b.socketPath])
        #expect(env.status == 0)
    }
}

/// Writes `bytes` to a new connection, half-closes, and returns what the broker answers.
func rawExchange(_ socketPath: String, _ bytes: [UInt8]) -> [UInt8] {
    let fd = connectUnixSocket(socketPath)
    guard fd >= 0 else { return [] }
    defer { close(fd) }
    _ = bytes.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
    shutdown(fd, Int32(SHUT_WR))
    var out: [UInt8] = []
    var buf = [UInt8](repeating: 0, count: 4096)
    while true {
        let n = read(fd, &buf, buf.count)
        if n <= 0 { break }
        out += buf[0..<n]
    }
    return out
}

func hex(_ b: [UInt8]) -> String { b.map { String(format: "%02x", $0) }.joined() }

final class Counter: @unchecked Sendable {
    private let lock = NSLock()
    private var n = 0
    func add() { lock.lock(); n += 1; lock.unlock() }
    func set(_ v: Int) { lock.lock(); n = v; lock.unlock() }
    var value: Int { lock.lock(); defer { lock.unlock() }; return n }
}
