import CKeyholdOS
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
        let result = try vault.rotate(service: c.positionals[0], account: c.positionals[1], reason: c.value("--reason"),
                                      timeout: timeout, expires: expires, interaction: interaction) { current throws -> SecureBytes in
            try runCommand(path, Array(command.dropFirst()), input: current, seconds: timeout)
        }
        defer { result.secret.wipe() }
        if c.flag("--print") && !Output.writeAll(1, result.secret) {
            throw .other("could not write the secret to standard output")
        }
    }

    /// COMMAND with `input` on its stdin; its stdout if it exits 0 in time, else a thrown error.
    static func runCommand(_ path: String, _ args: [String], input: SecureBytes, seconds: UInt32) throws(KeyholdError) -> SecureBytes {
        var inPipe: [Int32] = [-1, -1], outPipe: [Int32] = [-1, -1]
        guard ckh_pipe_cloexec(&inPipe) == 0 else { throw .other("cannot create a pipe") }
        guard ckh_pipe_cloexec(&outPipe) == 0 else { close(inPipe[0]); close(inPipe[1]); throw .other("cannot create a pipe") }
        let pid = Subprocess.spawn(path, args, stdinFD: inPipe[0], stdoutFD: outPipe[1])
        close(inPipe[0]); close(outPipe[1])
        guard let pid else { close(inPipe[1]); close(outPipe[0]); throw .other("cannot run \(path)") }
        let deadline = MonotonicClock.milliseconds() + Int64(seconds) * 1000
        // The secret fits the pipe's buffer (64 KiB): written at once, then stdin closes.
        _ = Output.writeAll(inPipe[1], input)
        close(inPipe[1])
        let output = SecureBytes(count: Limits.maxSecretBytes + 1)
        var count = 0
        var timedOut = false
        output.withUnsafeMutableBytes { buf in
            while count < buf.count {
                let left = deadline - MonotonicClock.milliseconds()
                if left <= 0 { timedOut = true; break }
                var pfd = pollfd(fd: outPipe[0], events: Int16(POLLIN), revents: 0)
                let p = poll(&pfd, 1, Int32(clamping: left))
                if p < 0 && errno == EINTR { continue }
                if p == 0 { timedOut = true; break }
                let n = read(outPipe[0], buf.baseAddress! + count, buf.count - count)
                if n < 0 && errno == EINTR { continue }
                if n <= 0 { break }
                count += n
            }
        }
        close(outPipe[0])
        let status = Subprocess.wait(pid, deadline: timedOut ? MonotonicClock.milliseconds() : deadline)
        defer { output.wipe() }
        if timedOut { throw .other("the command did not finish within \(seconds) s; nothing changed") }
        guard count <= Limits.maxSecretBytes else {
            throw .invalidRequest("the command's output exceeds \(Limits.maxSecretBytes) bytes; nothing changed")
        }
        guard let status else { throw .other("the command was killed; nothing changed") }
        guard status == 0 else { throw .other("the command exited \(status); nothing changed") }
        return output.withUnsafeBytes { SecureBytes(copying: UnsafeRawBufferPointer(rebasing: $0[0..<count])) }
    }

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
