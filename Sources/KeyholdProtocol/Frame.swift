import Glibc
import KeyholdCore

/// Framing of the broker protocol: a 4-byte big-endian length, then that many payload bytes.
///
/// This file and `WireFields.swift` are the only code that reads bytes a peer sent. Frames are
/// read into guarded memory because a frame may carry a secret; the buffer is wiped on release.
public enum Frame {
    /// Hard cap on a payload: a largest secret, an app password and the texts of a request fit.
    public static let maxPayloadBytes = Limits.maxSecretBytes + 32 * 1024

    /// Reads one frame. Returns nil on a clean end of stream before the first byte.
    public static func read(from fd: Int32) throws(FrameError) -> SecureBytes? {
        var header = [UInt8](repeating: 0, count: 4)
        let got = try readFully(fd, into: &header)
        if got == 0 { return nil }
        guard got == 4 else { throw .truncated }
        let length = try payloadLength(header[0], header[1], header[2], header[3])
        let payload = SecureBytes(count: length)
        let n = try payload.withUnsafeMutableBytes { (buf) throws(FrameError) -> Int in
            try readFully(fd, into: buf)
        }
        guard n == length else { throw .truncated }
        return payload
    }

    /// The payload length a 4-byte header declares, refused when it is below a payload's
    /// smallest (version and type) or above `maxPayloadBytes`: checked before anything is
    /// allocated for it.
    static func payloadLength(_ b0: UInt8, _ b1: UInt8, _ b2: UInt8, _ b3: UInt8) throws(FrameError) -> Int {
        let length = Int(b0) << 24 | Int(b1) << 16 | Int(b2) << 8 | Int(b3)
        guard length >= 2 else { throw .malformed("frame too short") }
        guard length <= maxPayloadBytes else { throw .oversized(length) }
        return length
    }

    /// Writes one frame: header and payload in one buffer so a reader never sees half a header.
    public static func write(_ payload: SecureBytes, to fd: Int32) throws(FrameError) {
        guard payload.count <= maxPayloadBytes else { throw .oversized(payload.count) }
        let framed = framed(payload)
        try framed.withUnsafeBytes { (buf) throws(FrameError) in try writeFully(fd, buf) }
    }

    /// Header and payload in one buffer (for a writer that sends it itself: the broker's event
    /// loop, which must not wait for a client). The caller checks the size, as `write` does.
    public static func framed(_ payload: SecureBytes) -> SecureBytes {
        let framed = SecureBytes(count: payload.count + 4)
        framed.withUnsafeMutableBytes { out in
            let n = payload.count
            out[0] = UInt8(truncatingIfNeeded: n >> 24); out[1] = UInt8(truncatingIfNeeded: n >> 16)
            out[2] = UInt8(truncatingIfNeeded: n >> 8); out[3] = UInt8(truncatingIfNeeded: n)
            payload.withUnsafeBytes { inp in
                if n > 0 { (out.baseAddress! + 4).copyMemory(from: inp.baseAddress!, byteCount: n) }
            }
        }
        return framed
    }

    static func readFully(_ fd: Int32, into array: inout [UInt8]) throws(FrameError) -> Int {
        // Array's closure APIs rethrow untyped errors; read into the buffer and re-raise typed.
        var failure: FrameError?
        let n = array.withUnsafeMutableBytes { buf -> Int in
            do throws(FrameError) { return try readFully(fd, into: buf) } catch { failure = error; return 0 }
        }
        if let failure { throw failure }
        return n
    }

    static func readFully(_ fd: Int32, into buf: UnsafeMutableRawBufferPointer) throws(FrameError) -> Int {
        var done = 0
        while done < buf.count {
            let r = Glibc.read(fd, buf.baseAddress! + done, buf.count - done)
            if r == 0 { break }
            if r < 0 {
                if errno == EINTR { continue }
                throw .io(errno)
            }
            done += r
        }
        return done
    }

    static func writeFully(_ fd: Int32, _ buf: UnsafeRawBufferPointer) throws(FrameError) {
        let code = DescriptorIO.writeAll(fd, buf, socket: true)
        if code != 0 { throw .io(code) }
    }
}

/// What can go wrong reading or decoding bytes from a peer. Never carries the bytes themselves.
public enum FrameError: Error, Equatable, CustomStringConvertible {
    case truncated
    case oversized(Int)
    case malformed(String)
    case unsupportedVersion(UInt8)
    case unexpectedMessage
    case io(Int32)

    public var description: String {
        switch self {
        case .truncated: "truncated frame"
        case .oversized(let n): "frame of \(n) bytes exceeds the \(Frame.maxPayloadBytes)-byte limit"
        case .malformed(let why): "malformed frame: \(why)"
        case .unsupportedVersion(let v): "unsupported protocol version \(v)"
        case .unexpectedMessage: "unexpected message"
        case .io(let e): "connection error (errno \(e))"
        }
    }
}
