import Glibc
import KeyholdClient
import KeyholdCore

/// The terminal saved before echo was turned off, so a Ctrl-C can put it back. A signal
/// handler cannot capture context, hence the global.
nonisolated(unsafe) private var savedTerminal: (fd: Int32, settings: termios)?

/// Ctrl-C during a prompt or a fingerprint wait: restore the terminal and exit with *user
/// canceled*. Closing the socket (by exiting) makes the broker end the PAM transaction.
private let onInterrupt: @convention(c) (Int32) -> Void = { _ in
    if var saved = savedTerminal { tcsetattr(saved.fd, TCSAFLUSH, &saved.settings) }
    _ = "\n".withCString { write(2, $0, 1) }
    _exit(Int32(Outcome.userCanceled.rawValue))
}

enum Terminal {
    static func installInterruptHandler() {
        signal(SIGINT, onInterrupt)
        signal(SIGTERM, onInterrupt)
        // A parent may have started us with these blocked (Foundation's Process does).
        var set = sigset_t()
        sigemptyset(&set)
        sigaddset(&set, SIGINT)
        sigaddset(&set, SIGTERM)
        pthread_sigmask(SIG_UNBLOCK, &set, nil)
    }

    /// The controlling terminal, or nil when there is none (a service, CI, `setsid`).
    static func open() -> Int32? {
        let fd = Glibc.open("/dev/tty", O_RDWR | O_CLOEXEC | O_NOCTTY)
        return fd >= 0 ? fd : nil
    }

    static func write(_ fd: Int32, _ text: String) {
        _ = text.withCString { Glibc.write(fd, $0, strlen($0)) }
    }

    /// Reads one line from `fd` into guarded memory, echo off when asked. Nil on end of input
    /// (Ctrl-D), which the caller treats as cancel.
    static func readLine(_ fd: Int32, echo: Bool) -> SecureBytes? {
        var settings = termios()
        let isTTY = tcgetattr(fd, &settings) == 0
        if isTTY && !echo {
            savedTerminal = (fd, settings)
            var quiet = settings
            quiet.c_lflag &= ~tcflag_t(ECHO)
            quiet.c_lflag |= tcflag_t(ECHONL)
            tcsetattr(fd, TCSAFLUSH, &quiet)
        }
        defer {
            if isTTY && !echo {
                tcsetattr(fd, TCSAFLUSH, &settings)
                savedTerminal = nil
            }
        }
        return readSecret(fd, stopAtNewline: true, limit: Limits.maxAnswerBytes)
    }

    /// Reads up to `limit` bytes (one more is read to detect an oversized input) into guarded
    /// memory. With `stopAtNewline`, stops at the first newline and strips it (and a CR).
    /// Nil when nothing at all could be read before end of input in line mode.
    static func readSecret(_ fd: Int32, stopAtNewline: Bool, limit: Int) -> SecureBytes? {
        let buffer = SecureBytes(count: limit + 1)
        var count = 0
        var sawNewline = false
        var sawEOF = false
        buffer.withUnsafeMutableBytes { buf in
            while count < buf.count {
                if stopAtNewline {
                    var byte: UInt8 = 0
                    let n = Glibc.read(fd, &byte, 1)
                    if n < 0 && errno == EINTR { continue }
                    if n <= 0 { sawEOF = true; break }
                    if byte == UInt8(ascii: "\n") { sawNewline = true; break }
                    buf[count] = byte
                    count += 1
                } else {
                    let n = Glibc.read(fd, buf.baseAddress! + count, buf.count - count)
                    if n < 0 && errno == EINTR { continue }
                    if n <= 0 { sawEOF = true; break }
                    count += n
                }
            }
            if stopAtNewline && count > 0 && buf[count - 1] == UInt8(ascii: "\r") { count -= 1 }
        }
        if stopAtNewline && sawEOF && !sawNewline && count == 0 { return nil }
        let out = buffer.withUnsafeBytes { SecureBytes(copying: UnsafeRawBufferPointer(rebasing: $0[0..<count])) }
        return out
    }
}

/// Prompts on the controlling terminal, or through `KEYHOLD_ASKPASS` when it is set (in the
/// manner of SSH_ASKPASS): the program gets the prompt as its only argument, prints the answer
/// on one line, and a non-zero exit means the person canceled.
final class PromptInteraction: Interaction {
    let tty: Int32?
    let askpass: String?

    /// Nil when neither a terminal nor an askpass program is available: then no prompt can be
    /// shown and the broker answers *interaction not allowed*.
    init?() {
        if let a = getenv("KEYHOLD_ASKPASS"), a.pointee != 0 {
            askpass = String(cString: a)
            tty = nil
        } else if let fd = Terminal.open() {
            askpass = nil
            tty = fd
        } else {
            return nil
        }
    }

    deinit { if let tty { close(tty) } }

    func answer(_ prompt: Prompt) -> SecureBytes? {
        if let askpass { return Askpass.ask(askpass, prompt: prompt.text) }
        guard let tty else { return nil }
        Terminal.write(tty, prompt.text)
        return Terminal.readLine(tty, echo: prompt.style == .echoOn)
    }

    func show(_ notice: Notice) {
        let line = notice.text.hasSuffix("\n") ? notice.text : notice.text + "\n"
        Terminal.write(tty ?? 2, line)
    }

    /// Asks twice (for a new secret or app password); nil on cancel, an error on mismatch.
    func askTwice(_ text: String) -> Result<SecureBytes, KeyholdError> {
        guard let first = answer(Prompt(style: .echoOff, purpose: .appPassword, text: text)) else { return .failure(.userCanceled) }
        guard let second = answer(Prompt(style: .echoOff, purpose: .appPassword, text: "Again: ")) else { return .failure(.userCanceled) }
        guard first.constantTimeEquals(second) else { return .failure(.invalidRequest("the two entries differ")) }
        return .success(first)
    }
}

enum Askpass {
    static func ask(_ program: String, prompt: String) -> SecureBytes? {
        var fds: [Int32] = [0, 0]
        guard pipe(&fds) == 0 else { return nil }
        guard let pid = Subprocess.spawn(program, [prompt], stdoutFD: fds[1]) else {
            close(fds[0]); close(fds[1])
            return nil
        }
        close(fds[1])
        let answer = Terminal.readSecret(fds[0], stopAtNewline: true, limit: Limits.maxAnswerBytes)
        close(fds[0])
        let status = Subprocess.wait(pid)
        guard status == 0 else { answer?.wipe(); return nil }
        return answer ?? SecureBytes(count: 0)
    }
}
