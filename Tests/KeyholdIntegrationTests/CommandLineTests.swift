import Foundation
import Glibc
import Testing
import KeyholdCore
import KeyholdTestSupport

/// Issue 38, item 4: the command line people expect. Every program answers `--version` and
/// `--help`; `keyhold help`; the newline of `get` on a terminal only; errors that name the
/// item and say what to do; tables cut to the terminal's width.
@Suite(.serialized) struct CommandLineTests {
    static let programs = ["keyhold", "keyholdd", "keyhold-secret-service", "git-credential-keyhold",
                           "docker-credential-keyhold", "keyhold-pam-helper", "keyhold-bench"]

    @Test func everyProgramPrintsTheOneVersionAndItsHelp() {
        for name in Self.programs {
            let path = TestPaths.products + "/" + name
            let version = runCommand(path, ["--version"])
            #expect(version.status == 0 && version.stdoutText == "\(name) \(KeyholdVersion.string)\n" && version.stderr.isEmpty,
                    "\(name) --version: \(version.status) \(version.stdoutText) \(version.stderr)")
            for flag in ["--help", "-h"] {
                let help = runCommand(path, [flag])
                #expect(help.status == 0 && help.stdoutText.hasPrefix("usage: \(name)") && help.stderr.isEmpty,
                        "\(name) \(flag): \(help.status) \(help.stdoutText.prefix(80)) \(help.stderr)")
            }
        }
        // The docker protocol's own `version` action names it too.
        let dockerVersion = runCommand(TestPaths.products + "/docker-credential-keyhold", ["version"])
        #expect(dockerVersion.status == 0 && dockerVersion.stdoutText == "docker-credential-keyhold (Keyhold) \(KeyholdVersion.string)\n")
        // `keyhold secret-service --help` reaches the agent's help (the command execs it).
        let agent = runCommand(TestPaths.keyhold, ["secret-service", "--help"])
        #expect(agent.status == 0 && agent.stdoutText.hasPrefix("usage: keyhold-secret-service"), "\(agent.stderr)")
    }

    @Test func helpListsEveryCommandWholeAtAnyWidth() {
        let commands = ["put", "get", "rotate", "rm", "ls", "state", "lock", "status", "biometry", "audit",
                        "secret-service", "demo", "help"]
        for columns in [40, 64, 80, 132] {
            let main = runCommand(TestPaths.keyhold, ["--help"], environment: ["COLUMNS": "\(columns)"])
            #expect(main.status == 0)
            let lines = main.stdoutText.split(separator: "\n", omittingEmptySubsequences: false)
            for line in lines where line.count > columns {
                // Only a single word longer than the line (a socket path) may stick out.
                #expect(!line.trimmingCharacters(in: .whitespaces).contains(" "), "\(columns): \(line)")
            }
            for c in commands {
                #expect(lines.contains { $0.hasPrefix("  \(c) ") || $0 == "  \(c)" }, "\(c) is not listed at \(columns) columns")
            }
            // Descriptions are whole: the first sentence of put's, joined again, is all there.
            let flat = main.stdoutText.split(whereSeparator: { $0 == " " || $0 == "\n" }).joined(separator: " ")
            #expect(flat.contains("Stores a secret read from standard input, exactly as given (from a terminal: asked twice without echo, newline stripped)."))
            #expect(flat.contains("Rotates a secret under one authentication: runs COMMAND (after --) with the current secret on its stdin and stores its stdout as the new secret if it exits 0."))
        }
        // `keyhold help COMMAND` is `keyhold COMMAND --help`; a sub-command too.
        for words in [["get"], ["put"], ["audit"], ["audit", "verify"], ["secret-service"]] {
            let help = runCommand(TestPaths.keyhold, ["help"] + words)
            #expect(help.status == 0 && help.stdoutText.hasPrefix("usage: keyhold \(words.joined(separator: " "))"), "\(words)")
            if words != ["secret-service"] {
                #expect(help.stdoutText == runCommand(TestPaths.keyhold, words + ["--help"]).stdoutText, "\(words)")
            }
        }
        let unknown = runCommand(TestPaths.keyhold, ["help", "steal"])
        #expect(unknown.status == 2 && unknown.stderr.contains("unknown command 'steal'"))
    }

    @Test func getAddsANewlineOnATerminalAndNeverToAPipe() throws {
        let b = try BrokerFixture()
        #expect(b.cli(["put", "nl", "x"], stdin: Array("no-newline-secret".utf8)).status == 0)
        #expect(b.cli(["put", "nl2", "x"], stdin: Array("ends-in-newline\n".utf8)).status == 0)
        // A pipe: the stored bytes, exactly.
        expectSecret(b.cli(["get", "nl", "x"]).stdout, equals: Array("no-newline-secret".utf8))
        expectSecret(b.cli(["get", "nl2", "x"]).stdout, equals: Array("ends-in-newline\n".utf8))
        // A terminal: the secret on its own line, the shell's next output below it.
        let tmux = TerminalTests.Tmux()
        let kh = "\(TestPaths.keyhold) --socket \(b.socketPath)"
        tmux.start("/bin/sh -c '\(kh) get nl x; echo AFTER-ONE; \(kh) get nl2 x; echo AFTER-TWO; sleep 30'")
        #expect(tmux.waitFor("AFTER-TWO"), "\(tmux.screen)")
        let screen = tmux.screen
        #expect(screen.contains("no-newline-secret\nAFTER-ONE\n"), "\(screen)")
        // A secret that ends in a newline gets no second one.
        #expect(screen.contains("ends-in-newline\nAFTER-TWO"), "\(screen)")
    }

    @Test func errorsNameTheItemAndSayWhatToDo() throws {
        let b = try BrokerFixture()
        let missing = b.cli(["get", "github.com", "alice"])
        #expect(missing.status == 3 && missing.stderr == "keyhold: github.com / alice: not found\n", "\(missing.stderr)")
        let rm = b.cli(["rm", "github.com", "bob"])
        #expect(rm.status == 3 && rm.stderr == "keyhold: github.com / bob: not found\n", "\(rm.stderr)")
        let duplicate = b.cli(["put", "github.com", "carol"], stdin: [1])
        #expect(duplicate.status == 0 && b.cli(["put", "github.com", "carol"], stdin: [1]).stderr
                == "keyhold: github.com / carol: an item with this service and account already exists\n")
        // A usage error is about the arguments: no item named.
        let usage = b.cli(["put", "github.com", "dave", "--reuse", "9999"], stdin: [1])
        #expect(usage.status == 2 && usage.stderr.hasPrefix("keyhold: --reuse"), "\(usage.stderr)")

        // No terminal, no askpass: the way to answer prompts anyway is named.
        #expect(b.cli(["put", "gated", "x", "--policy", "device-passcode"], stdin: [1]).status == 0)
        let noPrompt = b.cli(["get", "gated", "x"])
        #expect(noPrompt.status == 7 && noPrompt.stdout.isEmpty, "\(noPrompt.stderr)")
        #expect(noPrompt.stderr.hasPrefix("keyhold: gated / x: interaction not allowed") && noPrompt.stderr.contains("KEYHOLD_ASKPASS"),
                "\(noPrompt.stderr)")
        let asked = b.cli(["get", "gated", "x", "--no-interaction"])
        #expect(asked.status == 7 && asked.stderr.contains("(--no-interaction)") && !asked.stderr.contains("KEYHOLD_ASKPASS"), "\(asked.stderr)")

        // The broker is not running: the socket is gone, or nobody listens on it.
        b.stop()
        unlink(b.socketPath)
        for _ in 0..<2 {
            let down = b.cli(["ls"])
            #expect(down.status == 11 && down.stderr.contains("keyholdd is not running")
                    && down.stderr.contains("systemctl start keyholdd") && down.stderr.split(separator: "\n").count == 1, "\(down.stderr)")
            // Second round: a socket file nobody listens on (a broker killed without cleanup).
            let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
            var addr = sockaddr_un()
            addr.sun_family = sa_family_t(AF_UNIX)
            let bytes = Array(b.socketPath.utf8)
            withUnsafeMutableBytes(of: &addr.sun_path) { raw in raw.copyBytes(from: bytes); raw[bytes.count] = 0 }
            _ = withUnsafePointer(to: &addr) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
            }
            close(fd)
        }
    }

    @Test func tableCellsAreCutToTheTerminalWidthAndJSONKeepsThemWhole() throws {
        let b = try BrokerFixture()
        let longLabel = String(repeating: "L", count: 3000)
        let longReason = String(repeating: "r", count: 2000)
        #expect(b.cli(["put", "wide", "x", "--label", longLabel], stdin: Array("v".utf8)).status == 0)
        #expect(b.cli(["put", "narrow", "y"], stdin: Array("v".utf8)).status == 0)
        #expect(b.cli(["get", "wide", "x", "--reason", longReason]).status == 0)
        for command in [["ls"], ["audit"]] {
            let table = b.cli(command, environment: ["COLUMNS": "100"])
            #expect(table.status == 0)
            let lines = table.stdoutText.split(separator: "\n")
            #expect(lines.count >= 3 && lines.allSatisfy { $0.count <= 100 }, "\(command): \(lines.map(\.count))")
            #expect(table.stdoutText.contains("…"), "\(command)")
            #expect(table.stdoutText.contains("narrow"), "\(command): short cells stay whole")
        }
        // No terminal and no COLUMNS (a pipe into a script): every cell whole.
        #expect(b.cli(["ls"]).stdoutText.contains(longLabel))
        #expect(b.cli(["ls", "--json"], environment: ["COLUMNS": "100"]).stdoutText.contains(longLabel))
        #expect(b.cli(["audit", "--json"], environment: ["COLUMNS": "100"]).stdoutText.contains(longReason))
        // On a real terminal (tmux's 200 columns), without COLUMNS.
        let tmux = TerminalTests.Tmux()
        tmux.start("/bin/sh -c 'unset COLUMNS; \(TestPaths.keyhold) --socket \(b.socketPath) ls; echo LS-DONE; sleep 30'")
        #expect(tmux.waitFor("LS-DONE"), "\(tmux.screen)")
        let screen = tmux.screen
        #expect(screen.contains("…") && screen.contains("narrow") && !screen.contains(String(repeating: "L", count: 200)), "\(screen)")
    }
}
