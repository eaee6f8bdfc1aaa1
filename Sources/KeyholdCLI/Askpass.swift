import Glibc
import CKeyholdOS
import KeyholdCore

/// Answers a prompt through the `KEYHOLD_ASKPASS` program (in the manner of SSH_ASKPASS): it
/// gets the prompt as its only argument and prints the answer on one line; a non-zero exit
/// means the person canceled. A program that prints more than `Limits.maxAnswerBytes` before
/// its newline, or takes longer than the time limit, is killed and counts as canceled: it can
/// never hang the CLI.
public enum Askpass {
    static let timeLimitSeconds: Int64 = 120

    /// `KEYHOLD_ASKPASS_TIMEOUT` (seconds) is a test knob, documented as such in the README: it
    /// can only shorten the limit, so tests need not wait two minutes.
    static func timeLimitMilliseconds() -> Int64 {
        if let v = getenv("KEYHOLD_ASKPASS_TIMEOUT"), let s = Int64(String(cString: v)), s >= 1, s < timeLimitSeconds {
            return s * 1000
        }
        return timeLimitSeconds * 1000
    }

    /// `canceled` is asked every 100 ms while the program runs: once it says so, the program is
    /// killed and the prompt counts as canceled (the Secret Service agent's dismissed prompts).
    public static func ask(_ program: String, prompt: String, canceled: (() -> Bool)? = nil) -> SecureBytes? {
        let deadline = MonotonicClock.milliseconds() + timeLimitMilliseconds()
        var fds: [Int32] = [-1, -1]
        // Close-on-exec: only the child's stdout (a dup made by posix_spawn) holds the write end,
        // so its exit is the pipe's end and closing our read end stops a writer.
        guard ckh_pipe_cloexec(&fds) == 0 else { return nil }
        let pid = Subprocess.spawn(program, [prompt], stdoutFD: fds[1])
        close(fds[1])
        guard let pid else {
            close(fds[0])
            return nil
        }
        let answer = readLine(fds[0], limit: Limits.maxAnswerBytes, deadline: deadline, canceled: canceled)
        close(fds[0])
        guard let answer else {
            kill(pid, SIGKILL)
            _ = Subprocess.wait(pid)
            return nil
        }
        guard Subprocess.wait(pid, deadline: deadline) == 0 else {
            answer.wipe()
            return nil
        }
        return answer
    }

    /// The first line from `fd` (without its newline and a CR before it) in guarded memory;
    /// at end of input, what came. Nil when more than `limit` bytes come before a newline, on
    /// a read error, at `deadline`, or once `canceled` says so.
    static func readLine(_ fd: Int32, limit: Int, deadline: Int64, canceled: (() -> Bool)? = nil) -> SecureBytes? {
        let buffer = SecureBytes(count: limit + 1)
        defer { buffer.wipe() }
        var length: Int?
        buffer.withUnsafeMutableBytes { buf in
            var count = 0
            while count < buf.count {
                let left = deadline - MonotonicClock.milliseconds()
                guard left > 0, canceled?() != true else { return }
                var p = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
                let ready = poll(&p, 1, Int32(min(left, canceled == nil ? Int64(Int32.max) : 100)))
                if ready < 0 && errno == EINTR { continue }
                if ready == 0 && canceled != nil { continue }  // look at `canceled` again
                guard ready > 0 else { return }
                let n = read(fd, buf.baseAddress! + count, buf.count - count)
                if n < 0 && errno == EINTR { continue }
                guard n >= 0 else { return }
                if n == 0 { length = count; return }
                if let newline = buf[count..<(count + n)].firstIndex(of: UInt8(ascii: "\n")) {
                    length = newline
                    return
                }
                count += n
            }
        }
        guard var length else { return nil }
        return buffer.withUnsafeBytes { raw in
            if length > 0 && raw[length - 1] == UInt8(ascii: "\r") { length -= 1 }
            return SecureBytes(copying: UnsafeRawBufferPointer(rebasing: raw[0..<length]))
        }
    }
}
