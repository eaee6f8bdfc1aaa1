import Glibc
import KeyholdCore

/// Why a helper's standard input could not be taken. Never carries the input itself.
public enum HelperInputError: Error, Equatable, CustomStringConvertible {
    case tooLarge(limit: Int)
    case unreadable

    public var description: String {
        switch self {
        case .tooLarge(let limit): "input exceeds \(limit) bytes; nothing done"
        case .unreadable: "could not read standard input"
        }
    }
}

/// A helper's standard input: it carries a password, so it is read into guarded memory, whole,
/// with a cap, before any of it is parsed.
public enum HelperInput {
    /// A secret at the CLI's cap, escaped at worst 6:1 in JSON, plus the other fields.
    public static let maxBytes = Limits.maxSecretBytes * 6 + 8 * Limits.maxTextBytes

    /// Everything up to end of input, or (when `stopAtBlankLine`) up to the first empty line,
    /// as git-credential(1) ends a description. More than `limit` bytes is an error, not a cut.
    public static func read(_ fd: Int32 = 0, limit: Int = maxBytes, stopAtBlankLine: Bool) -> Result<SecureBytes, HelperInputError> {
        let buffer = SecureBytes(count: limit + 1)
        defer { buffer.wipe() }
        var count = 0
        var failed = false
        buffer.withUnsafeMutableBytes { buf in
            while count < buf.count {
                let n = Glibc.read(fd, buf.baseAddress! + count, buf.count - count)
                if n < 0 && errno == EINTR { continue }
                if n < 0 { failed = true; return }
                if n == 0 { return }
                let start = count
                count += n
                if stopAtBlankLine, let end = blankLineEnd(buf, from: start, to: count) { count = end; return }
            }
        }
        if failed { return .failure(.unreadable) }
        if count > limit { return .failure(.tooLarge(limit: limit)) }
        return .success(buffer.withUnsafeBytes { SecureBytes(copying: UnsafeRawBufferPointer(rebasing: $0[0..<count])) })
    }

    /// The offset just past the first empty line (a `\n` at the start or right after a `\n`,
    /// optionally with a CR) among the bytes newly read, or nil.
    static func blankLineEnd(_ buf: UnsafeMutableRawBufferPointer, from start: Int, to end: Int) -> Int? {
        var i = max(0, start - 2)
        while i < end {
            if buf[i] == UInt8(ascii: "\n") {
                let lineStart = i == 0 || buf[i - 1] == UInt8(ascii: "\n")
                let crLine = i >= 1 && buf[i - 1] == UInt8(ascii: "\r") && (i == 1 || buf[i - 2] == UInt8(ascii: "\n"))
                if lineStart || crLine { return i + 1 }
            }
            i += 1
        }
        return nil
    }

    /// Writes all of `bytes` to `fd`; false if it could not.
    @discardableResult
    public static func write(_ fd: Int32, _ bytes: SecureBytes) -> Bool {
        bytes.withUnsafeBytes { DescriptorIO.writeAll(fd, $0) == 0 }
    }

    /// One escaped line on stderr, prefixed with the helper's name. Never given a secret.
    public static func complain(_ helper: String, _ text: String) {
        let line = "\(helper): \(Printable.escape(text))\n"
        _ = line.withCString { Glibc.write(2, $0, strlen($0)) }
    }
}

/// Bytes of a reply being built in guarded memory (a reply carries a password).
public final class SecureWriter {
    private var chunks: [SecureBytes] = []

    public init() {}

    public func append(_ text: String) {
        var t = text
        t.withUTF8 { chunks.append(SecureBytes(copying: UnsafeRawBufferPointer($0))) }
    }

    public func append(_ bytes: SecureBytes) {
        chunks.append(bytes.withUnsafeBytes { SecureBytes(copying: $0) })
    }

    /// The whole reply, one guarded buffer.
    public func finish() -> SecureBytes {
        let total = chunks.reduce(0) { $0 + $1.count }
        let out = SecureBytes(count: total)
        out.withUnsafeMutableBytes { dst in
            var at = 0
            for c in chunks {
                c.withUnsafeBytes { src in
                    if src.count > 0 { (dst.baseAddress! + at).copyMemory(from: src.baseAddress!, byteCount: src.count) }
                }
                at += c.count
                c.wipe()
            }
        }
        chunks.removeAll()
        return out
    }
}
