import Foundation
import Glibc
import Testing
import KeyholdTestSupport

/// Hostile or broken `KEYHOLD_ASKPASS` programs: none can hang the CLI, each ends as *user
/// canceled* (exit 5), and the program gets only its standard descriptors. Every run is wrapped
/// in `timeout` so a regression fails instead of hanging the suite.
@Suite struct AskpassTests {
    func gated() throws -> BrokerFixture {
        let b = try BrokerFixture(passwords: ["root": "right"])
        #expect(b.cli(["put", "ask", "me", "--policy", "device-passcode"], stdin: Array("s3cr3t".utf8)).status == 0)
        return b
    }

    func askpass(_ b: BrokerFixture, _ name: String, _ body: String) -> String {
        let path = b.directory + "/" + name
        _ = FileManager.default.createFile(atPath: path, contents: Data(("#!/bin/sh\n" + body).utf8))
        chmod(path, 0o755)
        return path
    }

    /// `keyhold get ask me` through `program`; the status and the seconds it took.
    func get(_ b: BrokerFixture, askpass program: String, environment: [String: String] = [:]) -> (CommandResult, Double) {
        let start = Date()
        let r = b.script("timeout -s KILL 60 \"$KH_BIN\" --socket \"$KH_SOCK\" get ask me",
                         environment: environment.merging(["KEYHOLD_ASKPASS": program]) { a, _ in a })
        return (r, Date().timeIntervalSince(start))
    }

    func isGone(_ pidFile: String) -> Bool {
        guard let text = try? String(contentsOfFile: pidFile, encoding: .utf8),
              let pid = Int32(text.trimmingCharacters(in: .whitespacesAndNewlines)) else { return false }
        return kill(pid, 0) == -1 && errno == ESRCH
    }

    @Test func hundredKilobyteAnswerIsCanceledAtOnce() throws {
        let b = try gated()
        let flood = askpass(b, "flood", "head -c 102400 /dev/zero | tr '\\000' a\necho\n")
        let (r, seconds) = get(b, askpass: flood)
        print("100 KB askpass answer: exit \(r.status) after \(String(format: "%.3f", seconds)) s")
        #expect(r.status == 5 && r.stdout.isEmpty, "\(r.stderr)")
        #expect(seconds < 5)
        #expect(b.cli(["audit", "--json", "--item", "ask/me"]).stdoutText.contains("user-canceled"))
        // The item is intact and the right answer still opens it.
        let ok = b.cli(["get", "ask", "me"], environment: ["KEYHOLD_ASKPASS": b.askpass(answering: "right")])
        #expect(ok.status == 0, "\(ok.stderr)")
        expectSecret(ok.stdoutText, equals: "s3cr3t")
    }

    /// KEYHOLD_ASKPASS_TIMEOUT is the documented test knob that shortens the 120 s limit.
    @Test func askpassThatNeverExitsIsKilledAtTheTimeLimit() throws {
        let b = try gated()
        let silent = askpass(b, "silent", "echo $$ > \(b.directory)/silent.pid\nexec sleep 600\n")
        let (r, seconds) = get(b, askpass: silent, environment: ["KEYHOLD_ASKPASS_TIMEOUT": "2"])
        print("silent askpass: exit \(r.status) after \(String(format: "%.3f", seconds)) s (limit 2 s)")
        #expect(r.status == 5, "\(r.stderr)")
        #expect(seconds >= 1.9 && seconds < 20)
        #expect(isGone(b.directory + "/silent.pid"), "the askpass program was killed")

        // Answering and then staying alive is no better: its exit status decides, and it never comes.
        let lingering = askpass(b, "lingering", "echo $$ > \(b.directory)/lingering.pid\necho right\nexec sleep 600\n")
        let (r2, seconds2) = get(b, askpass: lingering, environment: ["KEYHOLD_ASKPASS_TIMEOUT": "2"])
        print("lingering askpass: exit \(r2.status) after \(String(format: "%.3f", seconds2)) s")
        #expect(r2.status == 5 && r2.stdout.isEmpty, "\(r2.stderr)")
        #expect(isGone(b.directory + "/lingering.pid"))
    }

    /// The askpass program inherits stdin, stdout (our pipe) and stderr, and nothing else:
    /// not the broker socket, not the pipe's read end, not /dev/tty.
    @Test func askpassGetsOnlyStandardDescriptors() throws {
        let b = try gated()
        let listing = b.directory + "/fds"
        // ls opens the directory it lists (fd 3); anything else was inherited.
        let lister = askpass(b, "lister", "ls /proc/self/fd > \(listing)\necho right\n")
        let (r, _) = get(b, askpass: lister)
        #expect(r.status == 0, "\(r.stderr)")
        expectSecret(r.stdoutText, equals: "s3cr3t")
        let fds = try String(contentsOfFile: listing, encoding: .utf8).split(separator: "\n").map(String.init)
        #expect(fds == ["0", "1", "2", "3"], "\(fds)")
    }
}
