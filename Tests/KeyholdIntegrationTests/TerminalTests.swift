import Foundation
import Glibc
import Testing
import KeyholdTestSupport

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
        #expect(tmux.screen.contains("asks for tty / acct: terminal-test"))
        tmux.keys("tty-password", "Enter")
        #expect(tmux.waitFor("get=0"), "\(tmux.screen)")
        // The echo check prints after get=0: wait for it, not just for get's status.
        #expect(tmux.waitFor("ECHO-"), "\(tmux.screen)")
        let screen = tmux.screen
        #expect(!screen.contains("typed-secret-value") && !screen.contains("tty-password"), "echo must be off: \(screen)")
        #expect(screen.contains("ECHO-ON"), "terminal echo restored: \(screen)")
        #expect(try String(contentsOfFile: out, encoding: .utf8) == "typed-secret-value")
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
        #expect(b.cli(["audit", "--json", "--item", "c/x"]).stdoutText.contains("user-canceled"))
    }
}
