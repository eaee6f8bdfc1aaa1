import Glibc

/// The one write-everything loop: every caller that must get all its bytes out (frames to a
/// peer, a secret to stdout, an export line, a key file, a PAM frame) goes through here.
public enum DescriptorIO {
    /// Writes every byte of `bytes` to `fd`. Retries EINTR. `socket`: uses send(MSG_NOSIGNAL),
    /// so a peer that went away is an error to handle, not a SIGPIPE. `deadline` (monotonic
    /// ns): on a non-blocking fd, waits for POLLOUT until then; nil waits as long as it takes.
    /// A blocking fd waits as long as its send timeout lets it (SO_SNDTIMEO; none: for ever).
    /// Returns 0, or the errno that stopped it (EIO for a write of 0 bytes, ETIMEDOUT at the
    /// deadline or the send timeout).
    @discardableResult
    public static func writeAll(_ fd: Int32, _ bytes: UnsafeRawBufferPointer, socket: Bool = false,
                                deadline: UInt64? = nil) -> Int32 {
        guard var p = bytes.baseAddress else { return 0 }
        var left = bytes.count
        while left > 0 {
            let n = socket ? send(fd, p, left, Int32(MSG_NOSIGNAL)) : write(fd, p, left)
            if n > 0 { p += n; left -= n; continue }
            if n == 0 { return EIO }
            let code = errno
            if code == EINTR { continue }
            guard code == EAGAIN || code == EWOULDBLOCK else { return code }
            // A blocking descriptor says EAGAIN only when its own send timeout (SO_SNDTIMEO)
            // passed with nothing taken: the peer is not reading. Waiting on would hold this
            // thread for as long as the peer likes (a broker session, for one).
            if deadline == nil, fcntl(fd, F_GETFL) & O_NONBLOCK == 0 { return ETIMEDOUT }
            var pfd = pollfd(fd: fd, events: Int16(POLLOUT), revents: 0)
            let wait = deadline.map { d in Int32(clamping: max(0, (Int64(d) - Int64(MonotonicClock.nanoseconds())) / 1_000_000)) } ?? -1
            if deadline != nil && wait == 0 { return ETIMEDOUT }
            let r = poll(&pfd, 1, wait)
            if r < 0 && errno == EINTR { continue }
            if r < 0 { return errno }
            if r == 0 { return ETIMEDOUT }
        }
        return 0
    }

    /// `writeAll` of a string's UTF-8 bytes.
    @discardableResult
    public static func writeAll(_ fd: Int32, _ text: String) -> Int32 {
        var text = text
        return text.withUTF8 { writeAll(fd, UnsafeRawBufferPointer($0)) }
    }
}
