import Foundation
import Glibc
import Testing
import KeyholdTestSupport

/// Issue 38, item 4: up to three tries of a mistyped password within one request, each
/// counted for the lockout; the same answer replayed is not a new guess.
@Suite(.serialized) struct PasswordRetryTests {
    /// An askpass program that gives `answers` in turn (the last one from then on) and counts
    /// how often it was asked in `DIR/NAME.count`.
    func askpass(_ b: BrokerFixture, _ answers: [String], name: String) -> (path: String, count: () -> Int) {
        let counter = b.directory + "/\(name).count"
        let cases = answers.enumerated().map { "  \($0.offset + 1)) printf '%s\\n' '\($0.element)' ;;" }.joined(separator: "\n")
        let body = """
            #!/bin/sh
            n=$(cat '\(counter)' 2>/dev/null || echo 0); n=$((n + 1)); echo "$n" > '\(counter)'
            case "$n" in
            \(cases)
              *) printf '%s\\n' '\(answers.last!)' ;;
            esac

            """
        let path = b.directory + "/" + name
        _ = FileManager.default.createFile(atPath: path, contents: Data(body.utf8))
        chmod(path, 0o755)
        return (path, { Int(((try? String(contentsOfFile: counter, encoding: .utf8)) ?? "0").trimmingCharacters(in: .whitespacesAndNewlines)) ?? 0 })
    }

    /// How many times PAM ran an auth stack (pam_exec logs one block per run).
    func pamRuns(_ log: String) -> Int {
        ((try? String(contentsOfFile: log, encoding: .utf8)) ?? "").split(separator: "\n").filter { $0.hasPrefix("PAM_SERVICE=") }.count
    }

    /// A broker whose PAM stacks log each run to `log`, with a `device-passcode` item gated/x.
    /// The probe fixture holds the PAM directory and the log: the caller keeps it alive.
    func gatedItem(_ secret: String) throws -> (BrokerFixture, String, BrokerFixture) {
        let probe = try BrokerFixture()
        probe.stop()
        let log = probe.directory + "/pam-runs"
        let b = try BrokerFixture(passwords: ["root": "right-password"], pamDirectory: try probe.pamDirectoryLoggingItems(to: log))
        #expect(b.cli(["put", "gated", "x", "--policy", "device-passcode"], stdin: Array(secret.utf8)).status == 0)
        return (b, log, probe)
    }

    @Test func aSecondTryWithinOneGetSucceeds() throws {
        let (b, log, probe) = try gatedItem("retry-secret")
        defer { withExtendedLifetime(probe) {} }
        let ask = askpass(b, ["mistyped", "right-password"], name: "typo")
        let get = b.cli(["get", "gated", "x"], environment: ["KEYHOLD_ASKPASS": ask.path])
        #expect(get.status == 0, "\(get.stderr)")
        expectSecret(get.stdoutText, equals: "retry-secret")
        #expect(get.stderr.contains("Sorry, try again."), "\(get.stderr)")
        #expect(ask.count() == 2 && pamRuns(log) == 2)
        // The success gave the attempt back: five more wrong tries are needed for a lockout.
        #expect(b.cli(["state", "gated", "x"]).stderr.isEmpty)
        let audit = b.cli(["audit", "--json", "--item", "gated/x"]).stdoutText
        #expect(audit.contains("\"method\":\"password\"") && audit.contains("\"outcome\":\"ok\""))
    }

    @Test func theSameAnswerAgainIsNotANewGuess() throws {
        let (b, log, probe) = try gatedItem("s")
        defer { withExtendedLifetime(probe) {} }
        let ask = askpass(b, ["always-wrong"], name: "replay")
        // Four replaying gets: each one PAM run and one failure; the fifth failure locks out.
        for n in 1...4 {
            let r = b.cli(["get", "gated", "x"], environment: ["KEYHOLD_ASKPASS": ask.path])
            #expect(r.status == 6 && r.stdout.isEmpty, "\(n): \(r.stderr)")
        }
        #expect(pamRuns(log) == 4 && ask.count() == 8, "asked twice per get, PAM ran once per get")
        #expect(b.cli(["get", "gated", "x"], environment: ["KEYHOLD_ASKPASS": ask.path]).status == 6)
        #expect(b.cli(["get", "gated", "x"], environment: ["KEYHOLD_ASKPASS": ask.path]).status == 9, "five failures lock out")
    }

    @Test func threeDifferentWrongTriesEndTheRequestAndEachCounts() throws {
        let (b, log, probe) = try gatedItem("s")
        defer { withExtendedLifetime(probe) {} }
        let ask = askpass(b, ["w1", "w2", "w3", "w4", "w5", "right-password"], name: "guesses")
        let first = b.cli(["get", "gated", "x"], environment: ["KEYHOLD_ASKPASS": ask.path])
        #expect(first.status == 6 && first.stdout.isEmpty && pamRuns(log) == 3 && ask.count() == 3, "\(first.stderr)")
        // Failures four and five (the fifth locks the uid out); the third try is refused
        // before PAM runs: locked out, although its answer would be right.
        let second = b.cli(["get", "gated", "x"], environment: ["KEYHOLD_ASKPASS": ask.path])
        #expect(second.status == 9 && second.stdout.isEmpty, "\(second.stderr)")
        #expect(pamRuns(log) == 5, "no PAM run for a guess past the lockout")
    }

    /// A person at a terminal mistypes, is told so, and types it right: one `get`.
    @Test func aMistypedPasswordOnTheTerminalIsAskedAgain() throws {
        let (b, log, probe) = try gatedItem("tty-retry-secret")
        defer { withExtendedLifetime(probe) {} }
        let tmux = TerminalTests.Tmux()
        let out = b.directory + "/out"
        tmux.start("/bin/sh -c 'unset KEYHOLD_ASKPASS; \(TestPaths.keyhold) --socket \(b.socketPath) get gated x > \(out); echo get=$?; sleep 30'")
        #expect(tmux.waitFor("Password:"), "\(tmux.screen)")
        tmux.keys("mistyped", "Enter")
        #expect(tmux.waitFor("Sorry, try again."), "\(tmux.screen)")
        tmux.keys("right-password", "Enter")
        #expect(tmux.waitFor("get=0"), "\(tmux.screen)")
        try expectSecret(String(contentsOfFile: out, encoding: .utf8), equals: "tty-retry-secret")
        #expect(pamRuns(log) == 2)
    }
}
