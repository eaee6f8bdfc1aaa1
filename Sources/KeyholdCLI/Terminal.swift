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

    /// Turns echo off on `fd` until `restore`: from the broker's announce on, keys typed before
    /// a prompt appears (while the PAM helper starts) are not shown, and each prompt flushes
    /// them so they cannot become an answer either. False if it was off already or `fd` is not
    /// a terminal.
    @discardableResult
    static func echoOff(_ fd: Int32) -> Bool {
        guard savedTerminal == nil else { return false }
        var settings = termios()
        guard tcgetattr(fd, &settings) == 0 else { return false }
        savedTerminal = (fd, settings)
        var quiet = settings
        quiet.c_lflag &= ~tcflag_t(ECHO | ECHONL)
        tcsetattr(fd, TCSAFLUSH, &quiet)
        return true
    }

    /// Puts back the settings `echoOff` or `readLine` saved for `fd`, discarding unread input
    /// (keys typed without echo must not reach the shell next).
    static func restore(_ fd: Int32) {
        guard var saved = savedTerminal, saved.fd == fd else { return }
        tcsetattr(fd, TCSAFLUSH, &saved.settings)
        savedTerminal = nil
    }

    /// Shows `prompt` on `fd` and reads one line into guarded memory, echo off when asked. Nil
    /// on end of input (Ctrl-D), which the caller treats as cancel. Input typed before the
    /// prompt is discarded; the prompt is drawn only after that, so whatever is typed once it
    /// shows is the answer (drawn first, a quick answer could fall in the discard). Inside an
    /// `echoOff` span, echo stays off afterwards.
    static func readLine(_ fd: Int32, prompt: String, echo: Bool) -> SecureBytes? {
        var current = termios()
        let isTTY = tcgetattr(fd, &current) == 0
        let withinQuiet = savedTerminal?.fd == fd
        if isTTY && (withinQuiet || !echo) {
            if !withinQuiet { savedTerminal = (fd, current) }
            var mode = savedTerminal!.settings
            if echo {
                mode.c_lflag |= tcflag_t(ECHO)
            } else {
                mode.c_lflag &= ~tcflag_t(ECHO)
                mode.c_lflag |= tcflag_t(ECHONL)
            }
            tcsetattr(fd, TCSAFLUSH, &mode)
        }
        write(fd, prompt)
        defer {
            if isTTY && withinQuiet {
                var quiet = savedTerminal!.settings
                quiet.c_lflag &= ~tcflag_t(ECHO | ECHONL)
                tcsetattr(fd, TCSAFLUSH, &quiet)
            } else if isTTY && !echo {
                restore(fd)
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
