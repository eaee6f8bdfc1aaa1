import Foundation
import Glibc
import Testing
import KeyholdTestSupport
import CKeyholdOS

/// The CLI on a real terminal (tmux): secrets typed without echo, prompts on /dev/tty, stdout
/// carrying only the secret, Ctrl-C restoring the terminal.
@Suite(.serialized) struct TerminalTests {
    final class Tmux {
        let server = "kh\(getpid())\(Int.random(in: 100...999))"
        /// tmux's server daemonizes and keeps what it inherited, so it is spawned directly
        /// (posix_spawn, waitpid on that pid) with its output in a file.
        @discardableResult
        func run(_ args: [String]) -> String {
            let out = "/tmp/\(server).out"
            let fd = open(out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
            let null = open("/dev/null", O_RDWR | O_CLOEXEC)
            defer { unlink(out) }
            var actions = posix_spawn_file_actions_t()
            posix_spawn_file_actions_init(&actions)
            posix_spawn_file_actions_adddup2(&actions, null, 0)
            posix_spawn_file_actions_adddup2(&actions, fd, 1)
            posix_spawn_file_actions_adddup2(&actions, null, 2)
            // The tmux server outlives this call: it must not keep another test's descriptor
            // (a script being written, which could then not be run: "Text file busy").
            _ = ckh_spawn_closefrom(&actions, 3)
            let argv = (["/usr/bin/tmux", "-L", server] + args).map { strdup($0) } + [nil]
            var pid: pid_t = 0
            let rc = posix_spawn(&pid, "/usr/bin/tmux", &actions, nil, argv, environ)
            posix_spawn_file_actions_destroy(&actions)
            argv.forEach { free($0) }
            close(fd); close(null)
            guard rc == 0 else { return "" }
            var status: Int32 = 0
            waitpid(pid, &status, 0)
            return (try? String(contentsOfFile: out, encoding: .utf8)) ?? ""
        }
        func start(_ shellCommand: String) { run(["new-session", "-d", "-x", "200", "-y", "50", shellCommand]) }
        func keys(_ k: String...) { run(["send-keys"] + k) }
        var screen: String { run(["capture-pane", "-p"]) }
        func waitFor(_ text: String, timeout: Double = 10) -> Bool {
            let end = Date().addingTimeInterval(timeout)
            while Date() < end {
                if screen.contains(text) { return true }
                usleep(50_000)
            }
            return false
        }
        deinit { run(["kill-server"]) }
    }

    @Test func promptsOnTheTerminalSecretOnStdoutOnly() throws {
        let probe = try BrokerFixture()
        probe.stop()
        let items = probe.directory + "/pam-items"
        let b = try BrokerFixture(passwords: ["root": "tty-password"], pamDirectory: try probe.pamDirectoryLoggingItems(to: items))
        let tmux = Tmux()
        let out = b.directory + "/out"
        let kh = "\(TestPaths.keyhold) --socket \(b.socketPath)"
        tmux.start("/bin/sh -c 'unset KEYHOLD_ASKPASS; \(kh) put tty acct --policy device-passcode; echo put=$?; " +
                   "\(kh) get tty acct --reason terminal-test > \(out); echo get=$?; stty -a | grep -q -- \" -echo \" && echo ECHO-OFF || echo ECHO-ON; sleep 30'")
        #expect(tmux.waitFor("Secret:"))
        tmux.keys("typed-secret-value", "Enter")
        #expect(tmux.waitFor("Again:"))
        tmux.keys("typed-secret-value", "Enter")
        #expect(tmux.waitFor("put=0"), "\(tmux.screen)")
        // The broker says who asks and why, then PAM's prompt, all on the terminal.
        #expect(tmux.waitFor("Password:"), "\(tmux.screen)")
        #expect(tmux.screen.contains("keyhold: tty / acct requested, reason: terminal-test\nkeyhold: by \(TestPaths.keyhold) (pid "), "\(tmux.screen)")
        tmux.keys("tty-password", "Enter")
        #expect(tmux.waitFor("get=0"), "\(tmux.screen)")
        // The echo check prints after get=0: wait for it, not just for get's status.
        #expect(tmux.waitFor("ECHO-"), "\(tmux.screen)")
        let screen = tmux.screen
        #expect(!screen.contains("typed-secret-value") && !screen.contains("tty-password"), "echo must be off: \(screen)")
        #expect(screen.contains("ECHO-ON"), "terminal echo restored: \(screen)")
        try expectSecret(String(contentsOfFile: out, encoding: .utf8), equals: "typed-secret-value")
        // PAM was told the caller's terminal, as the broker read it from /proc.
        #expect(try String(contentsOfFile: items, encoding: .utf8).split(separator: "\n").contains { $0.hasPrefix("PAM_TTY=/dev/pts/") })
    }

    @Test func controlCAtAPromptCancelsAndRestoresTheTerminal() throws {
        let b = try BrokerFixture(passwords: ["root": "tty-password"])
        #expect(b.cli(["put", "c", "x", "--policy", "device-passcode"], stdin: Array("v".utf8)).status == 0)
        let tmux = Tmux()
        // The shell ignores SIGINT so it survives the Ctrl-C meant for keyhold and reports.
        tmux.start("/bin/sh -c 'trap \"\" INT; unset KEYHOLD_ASKPASS; \(TestPaths.keyhold) --socket \(b.socketPath) get c x; echo status=$?; stty -a | grep -q -- \" -echo \" && echo ECHO-OFF || echo ECHO-ON; sleep 30'")
        #expect(tmux.waitFor("Password:"))
        tmux.keys("half-typ")
        tmux.keys("C-c")
        #expect(tmux.waitFor("status=5"), "\(tmux.screen)")
        #expect(tmux.waitFor("ECHO-ON"), "\(tmux.screen)")
        // keyhold exits at Ctrl-C without waiting for the broker, which audits the canceled
        // conversation when it sees the client gone: wait for that entry (bounded).
        var audit = ""
        for _ in 0..<100 {
            audit = b.cli(["audit", "--json", "--item", "c/x"]).stdoutText
            if audit.contains("user-canceled") { break }
            usleep(100_000)
        }
        #expect(audit.contains("user-canceled"), "\(audit)")
    }

    /// Writes an executable shell script into the fixture's directory.
    func writeScript(_ b: BrokerFixture, _ name: String, _ body: String) -> String {
        let path = b.directory + "/" + name
        _ = FileManager.default.createFile(atPath: path, contents: Data(("#!/bin/sh\n" + body).utf8))
        chmod(path, 0o755)
        return path
    }

    /// A same-user program passes a reason that returns the cursor, clears the line, moves up,
    /// sets the window title and draws a look-alike announce naming /usr/bin/git. The terminal
    /// shows it escaped inside the caller's line, and the line right above the prompt is the
    /// executable the broker verified.
    @Test func hostileReasonIsShownEscapedAndTheRealExecutableLast() throws {
        let b = try BrokerFixture(passwords: ["root": "tty-password"])
        #expect(b.cli(["put", "tty", "acct", "--policy", "device-passcode"], stdin: Array("v".utf8)).status == 0)
        let attacker = writeScript(b, "attacker", """
            unset KEYHOLD_ASKPASS
            reason=$(printf 'deploy\\342\\200\\256\\r\\033[2K\\033[1A\\033[1Gkeyhold: /usr/bin/git (pid 1) asks for github.com / me: fetch\\033]0;pwned\\007\\033[3;1Htig')
            "\(TestPaths.keyhold)" --socket "\(b.socketPath)" get tty acct --reason "$reason" > /dev/null; echo get=$?
            sleep 30

            """)
        let tmux = Tmux()
        tmux.start(attacker)
        #expect(tmux.waitFor("Password:"), "\(tmux.screen)")
        let lines = tmux.screen.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        print("terminal while the prompt waits:\n" + lines.filter { !$0.isEmpty }.joined(separator: "\n"))
        guard let prompt = lines.firstIndex(where: { $0.hasPrefix("Password:") }), prompt >= 2 else {
            Issue.record("no prompt line: \(lines)")
            return
        }
        #expect(lines[prompt - 1].hasPrefix("keyhold: by \(TestPaths.keyhold) (pid "), "\(lines)")
        #expect(lines[prompt - 2].hasPrefix("keyhold: tty / acct requested, reason: deploy\\u{202e}\\x0d\\x1b[2K\\x1b[1A\\x1b[1Gkeyhold: /usr/bin/git"),
                "\(lines)")
        #expect(!lines.contains { $0.hasPrefix("keyhold: /usr/bin/git") }, "no line starts with the fake announce: \(lines)")
        tmux.keys("tty-password", "Enter")
        #expect(tmux.waitFor("get=0"), "\(tmux.screen)")
    }

    /// Keys typed after the announce, while the PAM helper is still starting (here: a stack that
    /// sleeps 3 s before its prompt), are not echoed, and do not become part of the answer.
    @Test func typeAheadWhileTheHelperStartsIsNotEchoed() throws {
        let probe = try BrokerFixture()
        probe.stop()
        let b = try BrokerFixture(passwords: ["root": "tty-password"], pamDirectory: try probe.pamDirectoryDelayingPrompts(seconds: 3))
        #expect(b.cli(["put", "slow", "acct", "--policy", "device-passcode"], stdin: Array("v".utf8)).status == 0)
        let tmux = Tmux()
        tmux.start("/bin/sh -c 'unset KEYHOLD_ASKPASS; \(TestPaths.keyhold) --socket \(b.socketPath) get slow acct > /dev/null; echo get=$?; " +
                   "stty -a | grep -q -- \" -echo \" && echo ECHO-OFF || echo ECHO-ON; sleep 30'")
        // Keys typed before keyhold has even started are echoed by the terminal itself; the
        // announce is the first moment the CLI can act, so the keys follow it.
        #expect(tmux.waitFor("keyhold: by "), "\(tmux.screen)")
        tmux.keys("typed-ahead-XYZ")
        let early = tmux.screen
        #expect(!early.contains("Password:"), "the keys must arrive before the prompt: \(early)")
        #expect(tmux.waitFor("Password:"), "\(tmux.screen)")
        #expect(!tmux.screen.contains("typed-ahead"), "type-ahead must not be echoed: \(tmux.screen)")
        tmux.keys("tty-password", "Enter")
        #expect(tmux.waitFor("get=0"), "the type-ahead was discarded, not prefixed to the password: \(tmux.screen)")
        #expect(tmux.waitFor("ECHO-ON"), "\(tmux.screen)")
        let screen = tmux.screen
        #expect(!screen.contains("typed-ahead") && !screen.contains("tty-password"), "\(screen)")
    }
}
