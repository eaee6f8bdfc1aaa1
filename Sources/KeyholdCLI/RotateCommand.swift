import CKeyholdOS
import CKeyholdSpawn
import Glibc
import KeyholdClient
import KeyholdCore

/// `keyhold rotate SERVICE ACCOUNT [options] -- COMMAND [ARGS…]`: COMMAND gets the current
/// secret on stdin; if it exits 0 within the timeout, its stdout (exactly, at most 64 KiB)
/// becomes the new secret. Anything else (non-zero exit, a signal, the timeout, too much
/// output) cancels the rotation and nothing changes.
enum RotateCommand {
    static let spec = CommandSpec("rotate", positionals: ["SERVICE", "ACCOUNT"], options: [
        OptionSpec("--reason", value: "TEXT", help: "why the secret is needed (shown and audited)"),
        OptionSpec("--timeout", value: "SECONDS", help: "the lease's lifetime and the longest wait for another rotation (default 60)"),
        OptionSpec("--print", help: "write the new secret to standard output"),
        OptionSpec("--no-interaction", help: "fail with exit 7 rather than prompt"),
        OptionSpec("--expires", value: "TIME", help: "when the new secret expires (as for put); without it, none"),
    ], summary: """
        Rotates a secret under one authentication: runs COMMAND (after --) with the current
        secret on its stdin and stores its stdout as the new secret if it exits 0. While another
        rotate of the item runs, waits for it and takes its result without running COMMAND.
        """)

    /// Splits `keyhold … rotate … -- COMMAND ARGS` into what the parser sees and COMMAND.
    static func split(_ arguments: [String]) -> (options: [String], command: [String]?) {
        guard let dash = arguments.firstIndex(of: "--"), arguments[..<dash].contains("rotate") else { return (arguments, nil) }
        return (Array(arguments[..<dash]), Array(arguments[(dash + 1)...]))
    }

    static func run(_ vault: Vault, _ c: ParsedCommand, command: [String]?) throws(KeyholdError) {
        guard let command, let program = command.first, !program.isEmpty else {
            throw .invalidRequest("rotate needs a command after --")
        }
        var timeout = Limits.defaultRotationSeconds
        if let t = c.value("--timeout") {
            guard let n = UInt32(t), n >= 1, n <= Limits.maxRotationSeconds else {
                throw .invalidRequest("--timeout wants 1 to \(Limits.maxRotationSeconds) seconds")
            }
            timeout = n
        }
        let expires = try KeyholdCommand.expiry(c)
        guard let path = resolve(program) else { throw .invalidRequest("command not found: \(program)") }
        let interaction = c.flag("--no-interaction") ? nil : PromptInteraction()
        signal(SIGPIPE, SIG_IGN)  // a command that does not read its stdin must not kill us
        // A copy of what COMMAND printed, for the one case it would otherwise be lost: COMMAND
        // finished (the provider has already replaced the token) but the commit did not happen.
        var produced: SecureBytes?
        defer { produced?.wipe() }
        let result: RotationResult
        do throws(KeyholdError) {
            result = try vault.rotate(service: c.positionals[0], account: c.positionals[1], reason: c.value("--reason"),
                                      timeout: timeout, expires: expires, interaction: interaction,
                                      watchingBroker: { current, broker throws -> SecureBytes in
                let output = try runCommand(path, Array(command.dropFirst()), input: current, seconds: timeout, broker: broker)
                produced = output.withUnsafeBytes { SecureBytes(copying: $0) }
                return output
            })
        } catch {
            guard let produced else { throw error }
            // README "When a rotation is cut off": said plainly, and with --print the secret
            // still reaches the caller, who asked for it on stdout.
            let printed = c.flag("--print") && Output.writeAll(1, produced)
            Output.err("COMMAND finished but its new secret may not have been stored (\(error.description)). "
                + "If the item's generation did not change, "
                + (printed ? "store the new secret written to standard output with `keyhold put --update`."
                           : "that secret is lost (the provider may have revoked the old one): sign in again and store "
                             + "the new token with `keyhold put --update`; `rotate --print` writes it to standard output even then."))
            throw error
        }
        defer { result.secret.wipe() }
        if c.flag("--print") && !Output.writeAll(1, result.secret) {
            throw .other("could not write the secret to standard output")
        }
    }

    /// COMMAND with `input` on its stdin; its stdout if it exits 0 in time, else a thrown error.
    /// COMMAND does not outlive the rotation (issue 36 item 1): it runs in its own process
    /// group (under a warden, CKeyholdSpawn/ckeyholdspawn.c), which is killed when COMMAND
    /// exits, times out, when the broker's connection ends, by our SIGINT/SIGTERM/SIGHUP
    /// handlers, and by the warden if keyhold dies (kill -9: PR_SET_PDEATHSIG). On a
    /// terminal its group is the foreground one while it runs (it may prompt; Ctrl-C reaches it).
    static func runCommand(_ path: String, _ args: [String], input: SecureBytes, seconds: UInt32,
                           broker: BrokerWatch) throws(KeyholdError) -> SecureBytes {
        var inPipe: [Int32] = [-1, -1], outPipe: [Int32] = [-1, -1]
        guard ckh_pipe_cloexec(&inPipe) == 0 else { throw .other("cannot create a pipe") }
        guard ckh_pipe_cloexec(&outPipe) == 0 else { close(inPipe[0]); close(inPipe[1]); throw .other("cannot create a pipe") }
        let argv = ([path] + args).map { strdup($0) } + [nil]
        let envp = Subprocess.currentEnvironment().map { strdup($0) } + [nil]
        // On a terminal where we are in the foreground, COMMAND gets the foreground while it runs.
        let tty = Terminal.open().flatMap { fd -> Int32? in
            if tcgetpgrp(fd) == getpgrp() { return fd }
            close(fd)
            return nil
        } ?? -1
        CommandGroup.arm()
        defer {
            if tty >= 0 { _ = ckh_take_terminal_back(tty); close(tty) }
            CommandGroup.disarm()
        }
        let pid = ckh_spawn_bound(path, argv, envp, inPipe[0], outPipe[1], tty, CommandGroup.leader)
        argv.forEach { free($0) }
        envp.forEach { free($0) }
        close(inPipe[0]); close(outPipe[1])
        guard pid > 0 else { close(inPipe[1]); close(outPipe[0]); throw .other("cannot run \(path)") }
        let deadline = MonotonicClock.milliseconds() + Int64(seconds) * 1000
        // The secret fits the pipe's buffer (64 KiB): written at once, then stdin closes.
        _ = Output.writeAll(inPipe[1], input)
        close(inPipe[1])
        let output = SecureBytes(count: Limits.maxSecretBytes + 1)
        defer { output.wipe() }
        var count = 0
        var ended: CommandEnd?
        output.withUnsafeMutableBytes { buf in
            while count < buf.count {
                let left = deadline - MonotonicClock.milliseconds()
                if left <= 0 { ended = .timedOut; break }
                var fds = [pollfd(fd: outPipe[0], events: Int16(POLLIN), revents: 0),
                           pollfd(fd: broker.fd, events: Int16(POLLIN), revents: 0)]
                let p = poll(&fds, 2, Int32(clamping: left))
                if p < 0 && errno == EINTR { continue }
                if p == 0 { ended = .timedOut; break }
                if fds[1].revents != 0 { ended = .brokerLeft; break }
                let n = read(outPipe[0], buf.baseAddress! + count, buf.count - count)
                if n < 0 && errno == EINTR { continue }
                if n <= 0 { break }
                count += n
            }
        }
        close(outPipe[0])
        let status = CommandGroup.finish(pid, deadline: ended == nil ? deadline : MonotonicClock.milliseconds(), broker: broker)
        if ended == nil && status == .brokerLeft { ended = .brokerLeft }
        switch ended {
        case .timedOut: throw .other("the command did not finish within \(seconds) s; nothing changed")
        case .brokerLeft:
            throw .other("the broker's connection ended while the command ran; the command was stopped and nothing changed")
        case nil: break
        }
        guard count <= Limits.maxSecretBytes else {
            throw .invalidRequest("the command's output exceeds \(Limits.maxSecretBytes) bytes; nothing changed")
        }
        guard case .exited(let code) = status else { throw .other("the command was killed; nothing changed") }
        guard code == 0 else { throw .other("the command exited \(code); nothing changed") }
        return output.withUnsafeBytes { SecureBytes(copying: UnsafeRawBufferPointer(rebasing: $0[0..<count])) }
    }

    enum CommandEnd { case timedOut, brokerLeft }

    /// A command name as the shell would find it: a path as given, else the first match on $PATH.
    static func resolve(_ program: String) -> String? {
        if program.contains("/") { return access(program, X_OK) == 0 ? program : nil }
        let path = getenv("PATH").map { String(cString: $0) } ?? "/usr/local/bin:/usr/bin:/bin"
        for dir in path.split(separator: ":") where !dir.isEmpty {
            let candidate = "\(dir)/\(program)"
            if access(candidate, X_OK) == 0 { return candidate }
        }
        return nil
    }
}

/// COMMAND's process group while it runs, for the signal handlers: a handler cannot capture
/// context, hence a global; it is allocated before a handler can read it.
enum CommandGroup {
    nonisolated(unsafe) static let leader: UnsafeMutablePointer<pid_t> = {
        let p = UnsafeMutablePointer<pid_t>.allocate(capacity: 1)
        p.initialize(to: 0)
        return p
    }()

    enum Status: Equatable { case exited(Int32), killed, brokerLeft }

    /// SIGHUP's disposition before `arm`: under `nohup` (ignored) it stays ignored.
    nonisolated(unsafe) static var hangupBefore: sighandler_t?

    /// SIGINT, SIGTERM or SIGHUP while COMMAND runs: its whole group is killed before we exit
    /// (the broker then keeps the lease until the rotation's deadline: README).
    static func arm() {
        leader.pointee = 0
        signal(SIGINT, stopSignal)
        signal(SIGTERM, stopSignal)
        let hangup = signal(SIGHUP, stopSignal)
        hangupBefore = hangup
        if unsafeBitCast(hangup, to: Int.self) == unsafeBitCast(SIG_IGN, to: Int.self) { signal(SIGHUP, SIG_IGN) }
        // A parent may have started us with these blocked (Foundation's Process does).
        var set = sigset_t()
        sigemptyset(&set)
        for s in [SIGINT, SIGTERM, SIGHUP] { sigaddset(&set, s) }
        pthread_sigmask(SIG_UNBLOCK, &set, nil)
    }

    /// Back to the CLI's own handlers once COMMAND is gone.
    static func disarm() {
        leader.pointee = 0
        signal(SIGHUP, hangupBefore ?? SIG_DFL)
        Terminal.installInterruptHandler()
    }

    /// Waits for `pid` (the warden, which exits as COMMAND does) until `deadline` or until the
    /// broker leaves (either kills its group); then kills what is left of the group, before
    /// reaping the leader so the group's id cannot have been reused.
    static func finish(_ pid: pid_t, deadline: Int64, broker: BrokerWatch) -> Status {
        var stopped: Status?
        while ckh_exited_unreaped(pid) == 0 {
            if stopped == nil && broker.brokerLeft() { stopped = .brokerLeft }
            if stopped == nil && MonotonicClock.milliseconds() >= deadline { stopped = .killed }
            if stopped != nil { kill(-pid, SIGKILL) }
            usleep(5_000)
        }
        kill(-pid, SIGKILL)
        leader.pointee = 0
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
        if let stopped { return stopped }
        // WIFEXITED / WEXITSTATUS are macros Swift does not import.
        return status & 0x7f == 0 ? .exited((status >> 8) & 0xff) : .killed
    }
}

private let stopSignal: @convention(c) (Int32) -> Void = { _ in
    let group = CommandGroup.leader.pointee
    if group > 0 { kill(-group, SIGKILL) }
    _exit(Int32(Outcome.userCanceled.rawValue))
}

extension Output {
    /// Writes all of `bytes` to `fd`; false on an error.
    static func writeAll(_ fd: Int32, _ bytes: SecureBytes) -> Bool {
        bytes.withUnsafeBytes { raw -> Bool in
            var done = 0
            while done < raw.count {
                let n = Glibc.write(fd, raw.baseAddress! + done, raw.count - done)
                if n < 0 && errno == EINTR { continue }
                if n <= 0 { return false }
                done += n
            }
            return true
        }
    }

    /// Standard base64 (RFC 4648, padded), for `get --json`.
    static func base64(_ bytes: SecureBytes) -> String {
        let table = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)
        var out: [UInt8] = []
        bytes.withUnsafeBytes { b in
            var i = 0
            while i < b.count {
                let n = min(3, b.count - i)
                let v = (UInt32(b[i]) << 16) | (n > 1 ? UInt32(b[i + 1]) << 8 : 0) | (n > 2 ? UInt32(b[i + 2]) : 0)
                out.append(table[Int(v >> 18 & 63)]); out.append(table[Int(v >> 12 & 63)])
                out.append(n > 1 ? table[Int(v >> 6 & 63)] : UInt8(ascii: "=")); out.append(n > 2 ? table[Int(v & 63)] : UInt8(ascii: "="))
                i += 3
            }
        }
        return String(decoding: out, as: UTF8.self)
    }
}
