/// The one hex codec: lowercase out; in, lowercase only unless a caller accepts user-typed
/// uppercase too. Item ids, MACs and export rows, digests, and the demo token all use it.
public enum Hex {
    /// The sixteen lowercase digits, for encoders that write into guarded memory.
    public static let digits: [UInt8] = Array("0123456789abcdef".utf8)

    public static func encode<Bytes: Collection<UInt8>>(_ bytes: Bytes) -> String {
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count * 2)
        for b in bytes { out.append(digits[Int(b >> 4)]); out.append(digits[Int(b & 15)]) }
        return String(decoding: out, as: UTF8.self)
    }

    /// Writes the hex of `bytes` into `out` (twice as long), for secrets kept out of Strings.
    public static func encode(_ bytes: UnsafeRawBufferPointer, into out: UnsafeMutableRawBufferPointer) {
        precondition(out.count == bytes.count * 2)
        for (i, b) in bytes.enumerated() { out[2 * i] = digits[Int(b >> 4)]; out[2 * i + 1] = digits[Int(b & 15)] }
    }

    /// Nil unless `text` is an even number of hex digits: lowercase (one spelling per value),
    /// or either case with `allowingUppercase`.
    public static func decode(_ text: String, allowingUppercase: Bool = false) -> [UInt8]? {
        let chars = Array(text.utf8)
        guard chars.count % 2 == 0 else { return nil }
        func nibble(_ c: UInt8) -> UInt8? {
            switch c {
            case 48...57: c - 48
            case 97...102: c - 87
            case 65...70 where allowingUppercase: c - 55
            default: nil
            }
        }
        var out: [UInt8] = []
        out.reserveCapacity(chars.count / 2)
        var i = 0
        while i < chars.count {
            guard let hi = nibble(chars[i]), let lo = nibble(chars[i + 1]) else { return nil }
            out.append(hi << 4 | lo)
            i += 2
        }
        return out
    }
}
