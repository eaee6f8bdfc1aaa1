import KeyholdCore

/// A canonical, unambiguous byte encoding: every variable-length field is prefixed with its
/// 32-bit big-endian length, integers have a fixed width. Used for associated data, blind
/// indexes and audit MACs, where two different tuples must never encode to the same bytes.
struct CanonicalEncoder {
    private(set) var bytes: [UInt8] = []

    init(domain: String) {
        bytes.reserveCapacity(256)
        append(domain)
    }

    mutating func append(_ value: UInt8) { bytes.append(value) }

    mutating func append(_ value: UInt32) {
        bytes.append(UInt8(truncatingIfNeeded: value >> 24))
        bytes.append(UInt8(truncatingIfNeeded: value >> 16))
        bytes.append(UInt8(truncatingIfNeeded: value >> 8))
        bytes.append(UInt8(truncatingIfNeeded: value))
    }

    mutating func append(_ value: UInt64) {
        append(UInt32(truncatingIfNeeded: value >> 32))
        append(UInt32(truncatingIfNeeded: value))
    }

    mutating func append(_ value: Int64) { append(UInt64(bitPattern: value)) }

    mutating func append<C: Collection>(bytes field: C) where C.Element == UInt8 {
        append(UInt32(field.count))
        bytes.append(contentsOf: field)
    }

    mutating func append(_ text: String) {
        let utf8 = text.utf8
        append(UInt32(utf8.count))
        bytes.append(contentsOf: utf8)
    }

    /// An optional field: a presence byte, then the field.
    mutating func append(optionalBytes field: [UInt8]?) {
        if let field { append(UInt8(1)); append(bytes: field) } else { append(UInt8(0)) }
    }

    mutating func append(optional text: String?) {
        append(optionalBytes: text.map { Array($0.utf8) })
    }
}

/// Reads what `CanonicalEncoder` wrote. Every read is bounds-checked: the input may be hostile.
struct CanonicalDecoder {
    private let bytes: [UInt8]
    private var offset = 0

    init(_ bytes: [UInt8]) { self.bytes = bytes }

    var isAtEnd: Bool { offset == bytes.count }

    mutating func uint8() -> UInt8? {
        guard offset < bytes.count else { return nil }
        defer { offset += 1 }
        return bytes[offset]
    }

    mutating func uint32() -> UInt32? {
        guard bytes.count - offset >= 4 else { return nil }
        var v: UInt32 = 0
        for i in 0..<4 { v = v << 8 | UInt32(bytes[offset + i]) }
        offset += 4
        return v
    }

    mutating func uint64() -> UInt64? {
        guard let hi = uint32(), let lo = uint32() else { return nil }
        return UInt64(hi) << 32 | UInt64(lo)
    }

    mutating func field(maxCount: Int = Int(Int32.max)) -> [UInt8]? {
        guard let n = uint32(), Int(n) <= maxCount, bytes.count - offset >= Int(n) else { return nil }
        defer { offset += Int(n) }
        return Array(bytes[offset..<offset + Int(n)])
    }

    /// Text. Everything decoded here came out of an authenticated box this code sealed from a
    /// Swift String, so it is valid UTF-8; decoding without validation keeps listing fast, and
    /// any repaired byte would only make a name comparison fail.
    mutating func text(maxCount: Int = Limits.maxTextBytes) -> String? {
        guard let n = uint32(), Int(n) <= maxCount, bytes.count - offset >= Int(n) else { return nil }
        let start = offset
        offset += Int(n)
        return bytes.withUnsafeBufferPointer { String(decoding: UnsafeBufferPointer(rebasing: $0[start..<start + Int(n)]), as: UTF8.self) }
    }

    /// Consumes a field only if it is exactly `expected` (a domain label).
    mutating func expect(_ expected: StaticString) -> Bool {
        let want = UnsafeBufferPointer(start: expected.utf8Start, count: expected.utf8CodeUnitCount)
        guard let n = uint32(), Int(n) == want.count, bytes.count - offset >= want.count else { return false }
        defer { offset += want.count }
        return bytes[offset..<offset + want.count].elementsEqual(want)
    }

    mutating func optionalText(maxCount: Int = Limits.maxTextBytes) -> String?? {
        guard let flag = uint8() else { return nil }
        switch flag {
        case 0: return .some(nil)
        case 1: guard let t = text(maxCount: maxCount) else { return nil }; return .some(t)
        default: return nil
        }
    }
}
