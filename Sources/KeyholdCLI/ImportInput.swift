import CKeyholdOS
import Glibc
import KeyholdClient
import KeyholdCore

/// Reading a source into guarded memory: a file, or what a program (gpg, keepassxc-cli) writes
/// on its stdout. The source is opened read-only and never written; the bytes may all be secret.
enum ImportInput {
    /// A source file whole, at most `limit` bytes.
    static func readFile(_ path: String, limit: Int) throws(KeyholdError) -> SecureBytes {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw .other("cannot open \(path): \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        guard let bytes = readAll(fd, limit: limit) else { throw .other("cannot read \(path)") }
        guard bytes.count <= limit else {
            bytes.wipe()
            throw .invalidRequest("\(path) is larger than \(limit) bytes")
        }
        return bytes
    }

    /// Runs `path` with `arguments` (never a secret among them), our stdin (its prompts may
    /// read the terminal) and our stderr (its own messages); its stdout, at most `limit` bytes
    /// (one more means too much), and its exit status (nil: killed by a signal).
    static func capture(_ path: String, _ arguments: [String], limit: Int) -> (output: SecureBytes, status: Int32?)? {
        start(path, arguments).map { collect($0, limit: limit) }
    }

    /// `capture` in two halves, so several programs can run at once: started, its stdout a pipe...
    static func start(_ path: String, _ arguments: [String]) -> (pid: pid_t, stdout: Int32)? {
        var out: [Int32] = [-1, -1]
        guard ckh_pipe_cloexec(&out) == 0 else { return nil }
        let pid = Subprocess.spawn(path, arguments, stdinFD: 0, stdoutFD: out[1])
        close(out[1])
        guard let pid else { close(out[0]); return nil }
        return (pid, out[0])
    }

    /// ...then read to its end and waited for.
    static func collect(_ child: (pid: pid_t, stdout: Int32), limit: Int) -> (output: SecureBytes, status: Int32?) {
        let output = readAll(child.stdout, limit: limit) ?? SecureBytes(count: 0)
        close(child.stdout)  // a program still writing past the limit gets EPIPE and ends
        return (output, Subprocess.wait(child.pid))
    }

    /// All of `fd` up to `limit + 1` bytes, in guarded chunks joined at the end; nil on a read error.
    static func readAll(_ fd: Int32, limit: Int) -> SecureBytes? {
        var chunks: [(SecureBytes, Int)] = []
        var total = 0
        var failed = false
        while total <= limit {
            let chunk = SecureBytes(count: 64 * 1024)
            let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, min($0.count, limit + 1 - total)) }
            if n < 0 && errno == EINTR { continue }
            if n < 0 { failed = true; break }
            if n == 0 { break }
            chunks.append((chunk, n))
            total += n
        }
        defer { for (c, _) in chunks { c.wipe() } }
        if failed { return nil }
        let whole = SecureBytes(count: total)
        whole.withUnsafeMutableBytes { dst in
            var at = 0
            for (c, n) in chunks {
                c.withUnsafeBytes { (dst.baseAddress! + at).copyMemory(from: $0.baseAddress!, byteCount: n) }
                at += n
            }
        }
        return whole
    }

    /// The lines of `bytes` (LF or CRLF), as ranges, with their 1-based numbers.
    static func lines(_ raw: UnsafeRawBufferPointer) -> [(number: Int, range: Range<Int>)] {
        var out: [(Int, Range<Int>)] = []
        var start = 0
        var number = 1
        for i in 0...raw.count where i == raw.count || raw[i] == 0x0a {
            var end = i
            if end > start && raw[end - 1] == 0x0d { end -= 1 }
            if i < raw.count || end > start { out.append((number, start..<end)) }
            start = i + 1
            number += 1
        }
        return out
    }

    /// Text the broker accepts as a name or label: UTF-8, no NUL, within the limit.
    static func name(_ bytes: some Collection<UInt8>) -> String? {
        guard bytes.count <= Limits.maxTextBytes, !bytes.contains(0),
              let s = String(validating: Array(bytes), as: UTF8.self) else { return nil }
        return s
    }

    /// The user's home directory ($HOME, else the password database's).
    static func home() -> String? {
        if let h = getenv("HOME"), h.pointee != 0 { return String(cString: h) }
        guard let pw = getpwuid(getuid()), let dir = pw.pointee.pw_dir else { return nil }
        return String(cString: dir)
    }
}
