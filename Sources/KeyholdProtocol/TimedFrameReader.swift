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
    /// within `frameMilliseconds` of this call. nil on a clean end of stream before any byte.
    public mutating func read(idleMilliseconds: Int, frameMilliseconds: Int) throws(FrameError) -> SecureBytes? {
        senders = []
        let start = Self.nowMilliseconds()
        var header = [UInt8](repeating: 0, count: 4)
        var done = 0, failure: FrameError?
        let got = header.withUnsafeMutableBytes { buf -> Int in
            do throws(FrameError) {
                return try fill(buf, firstByteBy: start + idleMilliseconds, frameBy: start + frameMilliseconds, done: &done)
            } catch { failure = error; return 0 }
        }
        if let failure { throw failure }
        if got == 0 { return nil }
        guard got == 4 else { throw .truncated }
        let length = try Frame.payloadLength(header[0], header[1], header[2], header[3])
        let payload = SecureBytes(count: length)
        var payloadDone = 0
        let n = try payload.withUnsafeMutableBytes { (buf) throws(FrameError) -> Int in
            try fill(buf, firstByteBy: start + frameMilliseconds, frameBy: start + frameMilliseconds, done: &payloadDone)
        }
        guard n == length else { throw .truncated }
        return payload
    }

    /// `done` counts the bytes read so far, also when a deadline ends the read.
    private mutating func fill(_ buf: UnsafeMutableRawBufferPointer, firstByteBy: Int, frameBy: Int,
                               done: inout Int) throws(FrameError) -> Int {
        while done < buf.count {
            let left = (done == 0 ? min(firstByteBy, frameBy) : frameBy) - Self.nowMilliseconds()
            guard left > 0 else { throw .io(ETIMEDOUT) }
            let ready = ckh_poll1(fd, Int32(POLLIN), Int32(clamping: left))
            if ready < 0 { throw .io(errno) }
            if ready == 0 { throw .io(ETIMEDOUT) }
            var pid: Int32 = -1, uid: UInt32 = 0, gid: UInt32 = 0, pidfd: Int32 = -1
            let r = ckh_recv_cred(fd, buf.baseAddress! + done, UInt(buf.count - done), &pid, &uid, &gid, &pidfd)
            // Owned at once, so that it is closed on every path below.
            let handle = FrameSender.Handle(received: pidfd)
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
