import Glibc
import CKeyholdOS
import KeyholdCore

/// Who sent some bytes of a frame, as the kernel attached it to them (`SCM_CREDENTIALS`,
/// taken at the time of each `send`, and `SCM_PIDFD`). pid -1: the bytes came without
/// credentials. Two senders are the same when their pid, uid and gid are: the first bytes'
/// pidfd is the one kept.
public struct FrameSender: Sendable, Equatable {
    public let pid: Int32
    public let uid: UInt32
    public let gid: UInt32
    /// The kernel's pidfd of the sender: it names the process that sent, also once that process
    /// has exited and its pid number names another (where `pidfd_open` of the number would not).
    public enum Handle: Sendable {
        /// None came: a kernel without `SO_PASSPIDFD` (before 6.5).
        case notSent
        /// The kernel said it could make none: the sender had exited and been reaped (kernels
        /// before 6.16; later ones give a pidfd of the exited process).
        case gone
        case open(SenderPIDFD)

        /// What `ckh_recv_cred` reported: a pidfd (owned from here on, so it is closed on every
        /// path), -2 when the kernel could make none, -1 when none came.
        init(received pidfd: Int32) {
            self = pidfd >= 0 ? .open(SenderPIDFD(owning: pidfd)) : pidfd == -2 ? .gone : .notSent
        }
    }
    public let handle: Handle

    public init(pid: Int32, uid: UInt32, gid: UInt32, handle: Handle = .notSent) {
        self.pid = pid
        self.uid = uid
        self.gid = gid
        self.handle = handle
    }

    public static func == (a: FrameSender, b: FrameSender) -> Bool { a.pid == b.pid && a.uid == b.uid && a.gid == b.gid }
}

/// A sender's pidfd (received with a message, or opened by the broker where none came), closed
/// when its last holder lets go of it (the reader at its next frame, the broker's record of the
/// sender at the end of the request).
public final class SenderPIDFD: Sendable {
    public let fd: Int32
    public init(owning fd: Int32) { self.fd = fd }
    deinit { close(fd) }
}

/// The broker's reader of client frames: a deadline for the whole frame (not per `read`), and
/// the sender of every chunk. A client that trickles bytes or sits idle loses its connection
/// when the deadline passes (`FrameError.io(ETIMEDOUT)`).
public struct TimedFrameReader {
    public let fd: Int32
    /// Distinct senders of the bytes of the last frame read, in order of arrival.
    public private(set) var senders: [FrameSender] = []

    public init(fd: Int32) { self.fd = fd }

    /// Reads one frame: its first byte must come within `idleMilliseconds`, the whole frame
    /// within `frameMilliseconds` of this call. nil on a clean end of stream before any byte,
    /// and, with `idleEndsStream`, when no byte came within `idleMilliseconds` or the
    /// connection was reset before one (a kept connection that was simply not used again, or
    /// closed with an answer unread, is not an error).
    public mutating func read(idleMilliseconds: Int, frameMilliseconds: Int, idleEndsStream: Bool = false) throws(FrameError) -> SecureBytes? {
        senders = []
        let start = Self.nowMilliseconds()
        if let whole = try readInOneMessage(firstByteBy: start + idleMilliseconds, frameBy: start + frameMilliseconds) {
            return whole
        }
        var header = [UInt8](repeating: 0, count: 4)
        var failure: FrameError?
        var done = 0
        let got = header.withUnsafeMutableBytes { buf -> Int in
            do throws(FrameError) {
                return try fill(buf, firstByteBy: start + idleMilliseconds, frameBy: start + frameMilliseconds, done: &done)
            } catch { failure = error; return 0 }
        }
        if let failure {
            // Before any byte of a kept connection's next request: the client left (a reset
            // when it closed with our last answer unread) or did not ask again in time.
            if idleEndsStream, done == 0, failure == .io(ETIMEDOUT) || failure == .io(ECONNRESET) { return nil }
            throw failure
        }
        if got == 0 { return nil }
        guard got == 4 else { throw .truncated }
        let length = try Frame.payloadLength(header[0], header[1], header[2], header[3])
        let payload = SecureBytes(count: length)
        var payloadDone = 0
        let n = try payload.withUnsafeMutableBytes { (buf) throws(FrameError) -> Int in
            try fill(buf, firstByteBy: start + frameMilliseconds, frameBy: start + frameMilliseconds, done: &payloadDone,
                     likelyReady: true)
        }
        guard n == length else { throw .truncated }
        return payload
    }

    /// The usual frame, sent with one write (as every Keyhold client sends): once the first byte
    /// is there, a peek at the header (no credentials asked, so the kernel makes no pidfd) gives
    /// the length, and one recvmsg reads header and payload with their sender's credentials and
    /// pidfd, instead of one recvmsg (and one pidfd) for each. The kernel never joins the bytes
    /// of two writers in one read, so the sender of every byte is still known; bytes that come
    /// later are read by `fill`. nil, with nothing read, for everything else (a header not all
    /// there yet, a length that is refused, end of stream, an error): `read` then reads as the
    /// bytes come, and says why.
    private mutating func readInOneMessage(firstByteBy: Int, frameBy: Int) throws(FrameError) -> SecureBytes? {
        let left = min(firstByteBy, frameBy) - Self.nowMilliseconds()
        guard left > 0, ckh_poll1(fd, Int32(POLLIN), Int32(clamping: left)) > 0 else { return nil }
        var peeked: (UInt8, UInt8, UInt8, UInt8) = (0, 0, 0, 0)
        guard withUnsafeMutableBytes(of: &peeked, { ckh_peek(fd, $0.baseAddress!, 4) }) == 4 else { return nil }
        return try readPeeked(peeked, frameBy: frameBy)
    }

    /// A frame the caller found wholly in the socket (`ckh_frame_waiting`, the broker's event
    /// loop) with `header` peeked: read as `read` reads the usual frame, without waiting for
    /// its first byte; nil, with nothing read, when it cannot be (`read` then says why).
    public mutating func readWaiting(header: (UInt8, UInt8, UInt8, UInt8), frameMilliseconds: Int) throws(FrameError) -> SecureBytes? {
        senders = []
        return try readPeeked(header, frameBy: Self.nowMilliseconds() + frameMilliseconds)
    }

    private mutating func readPeeked(_ peeked: (UInt8, UInt8, UInt8, UInt8), frameBy: Int) throws(FrameError) -> SecureBytes? {
        guard let length = try? Frame.payloadLength(peeked.0, peeked.1, peeked.2, peeked.3) else { return nil }
        let payload = SecureBytes(count: length)
        var header: (UInt8, UInt8, UInt8, UInt8) = (0, 0, 0, 0)
        var pid: Int32 = -1, uid: UInt32 = 0, gid: UInt32 = 0, pidfd: Int32 = -1
        let r = withUnsafeMutableBytes(of: &header) { h in
            payload.withUnsafeMutableBytes { p in
                ckh_recv_cred2(fd, h.baseAddress!, 4, p.baseAddress!, UInt(length), 1, &pid, &uid, &gid, &pidfd)
            }
        }
        let failure = r < 0 ? errno : 0
        let handle = FrameSender.Handle(received: pidfd)
        if failure == EINTR || failure == EAGAIN { return nil }  // nothing read: `read` waits again
        if failure != 0 { throw .io(failure) }
        // Bytes were taken: their sender is named, whatever follows.
        senders.append(FrameSender(pid: pid, uid: uid, gid: gid, handle: handle))
        // The four bytes peeked were one writer's and still there: they are what was read.
        guard r >= 4, header == peeked else { throw .truncated }
        var done = r - 4
        if done < length {
            let n = try payload.withUnsafeMutableBytes { (buf) throws(FrameError) -> Int in
                try fill(buf, firstByteBy: frameBy, frameBy: frameBy, done: &done, likelyReady: true)
            }
            guard n == length else { throw .truncated }
        }
        return payload
    }

    /// `done` counts the bytes read so far, also when a deadline ends the read. `likelyReady`:
    /// the bytes usually came with what was read before (a payload sent with its header), so a
    /// read that does not wait is tried before the poll, which then runs only when it found none.
    private mutating func fill(_ buf: UnsafeMutableRawBufferPointer, firstByteBy: Int, frameBy: Int, done: inout Int,
                               likelyReady: Bool = false) throws(FrameError) -> Int {
        var pollFirst = !likelyReady
        while done < buf.count {
            let left = (done == 0 ? min(firstByteBy, frameBy) : frameBy) - Self.nowMilliseconds()
            guard left > 0 else { throw .io(ETIMEDOUT) }
            if pollFirst {
                let ready = ckh_poll1(fd, Int32(POLLIN), Int32(clamping: left))
                if ready < 0 { throw .io(errno) }
                if ready == 0 { throw .io(ETIMEDOUT) }
            }
            var pid: Int32 = -1, uid: UInt32 = 0, gid: UInt32 = 0, pidfd: Int32 = -1
            let r = ckh_recv_cred(fd, buf.baseAddress! + done, UInt(buf.count - done), pollFirst ? 0 : 1, &pid, &uid, &gid, &pidfd)
            // Owned at once, so that it is closed on every path below.
            let handle = FrameSender.Handle(received: pidfd)
            pollFirst = true
            if r == 0 { break }
            if r < 0 {
                if errno == EINTR || errno == EAGAIN { continue }
                throw .io(errno)
            }
            let sender = FrameSender(pid: pid, uid: uid, gid: gid, handle: handle)
            if !senders.contains(sender) { senders.append(sender) }
            done += r
        }
        return done
    }

    static func nowMilliseconds() -> Int { Int(MonotonicClock.milliseconds()) }
}
