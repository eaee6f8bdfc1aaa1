import Foundation
import Glibc
import Testing
import KeyholdCore
import KeyholdVault
import KeyholdTestSupport

/// Issue 10: refresh tokens that rotate, through the real broker and CLI, against a fixture
/// identity provider (Tests/fixtures/idp) that revokes the token family on any reuse.
@Suite(.serialized) struct RotationTests {
    static let fixtures = TestPaths.repository + "/Tests/fixtures/idp"

    /// The fixture provider on 127.0.0.1, started for one test and killed after it.
    final class Provider: @unchecked Sendable {
        let process = Process()
        let portFile: String
        init(directory: String) throws {
            portFile = directory + "/idp.port"
            process.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
            process.arguments = [RotationTests.fixtures + "/idp.py", portFile]
            try process.run()
            for _ in 0..<200 where !FileManager.default.fileExists(atPath: portFile) { usleep(50_000) }
        }
        func ask(_ line: String) -> String {
            guard let text = try? String(contentsOfFile: portFile, encoding: .utf8), let port = UInt16(text) else { return "" }
            let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            defer { close(fd) }
            var addr = sockaddr_in(sin_family: sa_family_t(AF_INET), sin_port: port.bigEndian,
                                   sin_addr: in_addr(s_addr: inet_addr("127.0.0.1")), sin_zero: (0, 0, 0, 0, 0, 0, 0, 0))
            let rc = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
            guard rc == 0 else { return "" }
            _ = (line + "\n").withCString { write(fd, $0, strlen($0)) }
            var out: [UInt8] = []
            var buf = [UInt8](repeating: 0, count: 4096)
            while true {
                let n = read(fd, &buf, buf.count)
                if n <= 0 { break }
                out += buf[0..<n]
            }
            return String(decoding: out, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        }
        var stats: [String: Any] {
            (try? JSONSerialization.jsonObject(with: Data(ask("STATS").utf8))) as? [String: Any] ?? [:]
        }
        deinit {
            // SIGKILL: the test runner's blocked SIGTERM is inherited by the child.
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
    }

    func redeem(_ p: Provider) -> [String] { ["--", "/usr/bin/python3", Self.fixtures + "/redeem.py", p.portFile] }

    func json(_ r: CommandResult) -> [String: Any] {
        (try? JSONSerialization.jsonObject(with: Data(r.stdout))) as? [String: Any] ?? [:]
    }

    /// The secret and generation `get --json` reports.
    func current(_ b: BrokerFixture, _ s: String = "idp", _ a: String = "me",
                 environment: [String: String] = [:]) -> (secret: String, generation: Int) {
        let j = json(b.cli(["get", s, a, "--json"], environment: environment))
        let secret = (j["secret"] as? String).flatMap { Data(base64Encoded: $0) }.map { String(decoding: $0, as: UTF8.self) } ?? "?"
        return (secret, j["generation"] as? Int ?? -1)
    }

    func updates(_ b: BrokerFixture, _ item: String = "idp/me") -> Int {
        b.cli(["audit", "--json", "--item", item]).stdoutText.split(separator: "\n")
            .filter { $0.contains("\"operation\":\"update\"") && $0.contains("\"decision\":\"granted\"") }.count
    }

    @Test func eightProcessesRotatingFiftyTimesNeverReuseAToken() throws {
        let b = try BrokerFixture()
        let idp = try Provider(directory: b.directory)
        let first = idp.ask("ISSUE")
        #expect(b.cli(["put", "idp", "me", "--kind", "refresh-token"], stdin: Array(first.utf8)).status == 0)
        let failures = LockedCounter()
        let started = Date()
        let finished = LockedCounter()
        let threads = (0..<8).map { _ in
            Thread {
                defer { finished.add() }
                for _ in 0..<50 {
                    usleep(UInt32.random(in: 0...20_000))  // random moments
                    let r = b.cli(["rotate", "idp", "me", "--print"] + redeem(idp))
                    if r.status != 0 { failures.add() }
                    if r.stdout.isEmpty { failures.add() }
                }
            }
        }
        for t in threads { t.start() }
        while finished.value < threads.count { usleep(50_000) }
        let seconds = Date().timeIntervalSince(started)
        let stats = idp.stats
        let redemptions = stats["redemptions"] as? Int ?? -1
        print("8 x 50 rotates: \(redemptions) redemptions in \(String(format: "%.1f", seconds)) s, failures \(failures.value)")
        #expect(failures.value == 0)
        #expect(stats["revoked"] as? Bool == false, "the token family was revoked: a token was redeemed twice")
        #expect(stats["reuses"] as? Int == 0 && stats["invalid"] as? Int == 0)
        #expect(redemptions >= 1 && redemptions <= 400)
        expectSecret(current(b).secret, equals: stats["current"] as? String, "the stored token is the provider's latest")
        #expect(updates(b) == redemptions, "one audited update per redemption")
        #expect(current(b).generation == 1 + redemptions)
    }

    @Test func ifGenerationRightAndStale() throws {
        let b = try BrokerFixture()
        #expect(b.cli(["put", "idp", "me"], stdin: Array("one".utf8)).status == 0)
        #expect(current(b).generation == 1)
        let right = b.cli(["put", "idp", "me", "--update", "--if-generation", "1"], stdin: Array("two".utf8))
        #expect(right.status == 0, "\(right.stderr)")
        let stale = b.cli(["put", "idp", "me", "--update", "--if-generation", "1"], stdin: Array("three".utf8))
        #expect(stale.status == 14, "\(stale.stderr)")
        // The broker's account reaches the user: where the item is now.
        #expect(stale.stderr.contains("conflict: the item is at generation 2; nothing was changed"), "\(stale.stderr)")
        expectSecret(current(b).secret, equals: "two")
        #expect(current(b).generation == 2)

        // An item that is gone is not at any generation: conflict, and nothing is created.
        #expect(b.cli(["rm", "idp", "me"]).status == 0)
        let gone = b.cli(["put", "idp", "me", "--update", "--if-generation", "2"], stdin: Array("four".utf8))
        #expect(gone.status == 14, "\(gone.stderr)")
        #expect(gone.stderr.contains("conflict: the item does not exist (expected generation 2)"), "\(gone.stderr)")
        #expect(b.cli(["state", "idp", "me"]).stdoutText == "not-found\n")
    }

    @Test func tamperedGenerationColumnFailsIntegrity() throws {
        let b = try BrokerFixture()
        #expect(b.cli(["put", "idp", "me"], stdin: Array("one".utf8)).status == 0)
        #expect(b.cli(["rotate", "idp", "me", "--", "/bin/sh", "-c", "printf two"]).status == 0)
        b.stop()
        do {
            let db = try Database(path: b.stateDirectory + "/vault.db")
            try db.execute("UPDATE items SET generation = generation + 5")
            db.close()
        }
        try b.start()
        let marker = b.directory + "/ran"
        let r = b.cli(["rotate", "idp", "me", "--", "/bin/sh", "-c", "touch \(marker); printf three"])
        #expect(r.status == 13, "\(r.stderr)")
        #expect(!FileManager.default.fileExists(atPath: marker), "COMMAND never saw a secret")
    }

    @Test func failedHungOrKilledCommandChangesNothing() throws {
        let b = try BrokerFixture()
        #expect(b.cli(["put", "idp", "me"], stdin: Array("old".utf8)).status == 0)
        let fails = b.cli(["rotate", "idp", "me", "--", "/bin/sh", "-c", "cat >/dev/null; printf new; exit 3"])
        #expect(fails.status == 1 && fails.stderr.contains("exited 3"), "\(fails.stderr)")
        let hangs = b.cli(["rotate", "idp", "me", "--timeout", "2", "--", "/bin/sh", "-c", "printf new; exec sleep 600"])
        #expect(hangs.status == 1 && hangs.stderr.contains("did not finish"), "\(hangs.stderr)")
        let killed = b.cli(["rotate", "idp", "me", "--", "/bin/sh", "-c", "printf new; kill -9 $$"])
        #expect(killed.status == 1 && killed.stderr.contains("killed"), "\(killed.stderr)")
        let tooMuch = b.cli(["rotate", "idp", "me", "--", "/bin/sh", "-c", "head -c 70000 /dev/zero"])
        #expect(tooMuch.status == 2, "\(tooMuch.stderr)")
        expectSecret(current(b).secret, equals: "old")
        #expect(current(b).generation == 1)
        #expect(updates(b) == 0)
        let next = b.cli(["rotate", "idp", "me", "--", "/bin/sh", "-c", "cat >/dev/null; printf new"])
        #expect(next.status == 0, "\(next.stderr)")
        expectSecret(current(b).secret, equals: "new")
        #expect(current(b).generation == 2)
    }

    /// The shell that started `keyhold rotate` killed with SIGKILL (keyhold itself lives on),
    /// then COMMAND killed by someone else: keyhold cancels, nothing changes, and the cancel
    /// frees the lease at once. (keyhold itself killed: RotationCutOffTests, where the lease is
    /// kept until the rotation's deadline.)
    @Test func rotateKilledMidRotationChangesNothing() throws {
        let b = try BrokerFixture()
        #expect(b.cli(["put", "idp", "me"], stdin: Array("old".utf8)).status == 0)
        let d = b.directory
        let r = b.script("""
            KH rotate idp me -- /bin/sh -c 'echo $$ > \(d)/cmd.pid; exec sleep 600' &
            pid=$!
            i=0; while [ ! -s \(d)/cmd.pid ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done
            kill -9 $pid; wait $pid; echo "rotate:$?"
            kill -9 $(cat \(d)/cmd.pid)
            """)
        #expect(r.stdoutText.contains("rotate:137"), "\(r.stdoutText) \(r.stderr)")
        expectSecret(current(b).secret, equals: "old")
        #expect(current(b).generation == 1)
        let start = Date()
        let next = b.cli(["rotate", "idp", "me", "--timeout", "5", "--", "/bin/sh", "-c", "printf new"])
        #expect(next.status == 0, "\(next.stderr)")
        #expect(Date().timeIntervalSince(start) < 5, "the lease died with the connection")
        expectSecret(current(b).secret, equals: "new")
        #expect(current(b).generation == 2)
    }

    /// While one rotate holds the lease: a second waits and takes its result without running
    /// its command; a plain get answers at once with the current secret; a put --update waits.
    @Test func secondRotateTakesTheFirstOnesResult() throws {
        let b = try BrokerFixture()
        #expect(b.cli(["put", "idp", "me"], stdin: Array("old".utf8)).status == 0)
        let d = b.directory
        let r = b.script("""
            KH rotate idp me -- /bin/sh -c 'touch \(d)/a-started; sleep 2; printf from-a' &
            a=$!
            i=0; while [ ! -e \(d)/a-started ] && [ $i -lt 300 ]; do sleep 0.05; i=$((i+1)); done
            printf 'get:'; KH get idp me; echo
            KH rotate idp me --print -- /bin/sh -c 'touch \(d)/b-ran; printf from-b' > \(d)/b.out; echo "b:$?"
            wait $a; echo "a:$?"
            """)
        let getAnsweredOld = r.stdoutText.contains("get:old")
        #expect(getAnsweredOld, "\(r.stdout.count) bytes on stdout, \(r.stderr)")
        #expect(r.stdoutText.contains("a:0") && r.stdoutText.contains("b:0"), "\(r.stdout.count) bytes on stdout, \(r.stderr)")
        expectSecret(try? String(contentsOfFile: d + "/b.out", encoding: .utf8), equals: "from-a")
        #expect(!FileManager.default.fileExists(atPath: d + "/b-ran"), "the second rotate did not redeem again")
        expectSecret(current(b).secret, equals: "from-a")
        #expect(current(b).generation == 2)

        let p = b.script("""
            KH rotate idp me -- /bin/sh -c 'touch \(d)/c-started; sleep 2; printf from-c' &
            c=$!
            i=0; while [ ! -e \(d)/c-started ] && [ $i -lt 300 ]; do sleep 0.05; i=$((i+1)); done
            printf from-put | KH put idp me --update; echo "put:$?"
            wait $c; echo "c:$?"
            """)
        #expect(p.stdoutText.contains("put:0") && p.stdoutText.contains("c:0"), "\(p.stdoutText) \(p.stderr)")
        expectSecret(current(b).secret, equals: "from-put", "the put waited and replaced the rotation's secret")
        #expect(current(b).generation == 4, "the put waited and replaced the rotation's secret")
    }

    @Test func passwordGatedItemRotatesWithOnePrompt() throws {
        let b = try BrokerFixture(passwords: ["root": "right"])
        #expect(b.cli(["put", "idp", "me", "--policy", "device-passcode"], stdin: Array("old".utf8)).status == 0)
        let count = b.directory + "/asked"
        func askpass(_ answer: String) -> String {
            let path = b.directory + "/askpass-\(answer)"
            _ = FileManager.default.createFile(atPath: path, contents: Data("#!/bin/sh\necho x >> \(count)\nprintf '%s\\n' '\(answer)'\n".utf8))
            chmod(path, 0o755)
            return path
        }
        func asked() -> Int { ((try? String(contentsOfFile: count, encoding: .utf8)) ?? "").split(separator: "\n").count }
        let marker = b.directory + "/ran"
        let command = ["--", "/bin/sh", "-c", "touch \(marker); cat >/dev/null; printf new"]
        let ok = b.cli(["rotate", "idp", "me"] + command, environment: ["KEYHOLD_ASKPASS": askpass("right")])
        #expect(ok.status == 0, "\(ok.stderr)")
        #expect(asked() == 1, "exactly one prompt for the release and the update")
        #expect(current(b, environment: ["KEYHOLD_ASKPASS": askpass("right")]).generation == 2)
        try? FileManager.default.removeItem(atPath: marker)
        let wrong = b.cli(["rotate", "idp", "me"] + command, environment: ["KEYHOLD_ASKPASS": askpass("wrong")])
        #expect(wrong.status == 6, "\(wrong.stderr)")
        let quiet = b.cli(["rotate", "idp", "me", "--no-interaction"] + command)
        #expect(quiet.status == 7, "\(quiet.stderr)")
        #expect(!FileManager.default.fileExists(atPath: marker), "COMMAND never ran without authentication")
        let after = current(b, environment: ["KEYHOLD_ASKPASS": askpass("right")])
        expectSecret(after.secret, equals: "new", "nothing rotated after the refusals")
        #expect(after.generation == 2, "nothing rotated after the refusals")
    }
}

final class LockedCounter: @unchecked Sendable {
    private let lock = NSLock()
    private var n = 0
    func add() { lock.lock(); n += 1; lock.unlock() }
    var value: Int { lock.lock(); defer { lock.unlock() }; return n }
}
