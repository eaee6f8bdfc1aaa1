import KeyholdCore

/// Tag-length-value fields inside a frame's payload: tag (1 byte), length (4 bytes, big
/// endian), value. Decoding is strict: every length is checked against what remains, texts
/// must be valid UTF-8 within `Limits.maxTextBytes`, numbers are exactly 8 bytes, and each
/// message accepts only its own tags.
public struct Field {
    public enum Value {
        case bytes([UInt8])
        case secret(SecureBytes)
        case nested([Field])
    }

    public let tag: UInt8
    public let value: Value

    public init(_ tag: UInt8, _ value: Value) {
        self.tag = tag
        self.value = value
    }

    public static func text(_ tag: UInt8, _ s: String) -> Field { Field(tag, .bytes(Array(s.utf8))) }
    public static func number(_ tag: UInt8, _ n: UInt64) -> Field {
        Field(tag, .bytes((0..<8).map { UInt8(truncatingIfNeeded: n >> (56 - 8 * $0)) }))
    }
    public static func flag(_ tag: UInt8) -> Field { Field(tag, .bytes([1])) }
    public static func secret(_ tag: UInt8, _ s: SecureBytes) -> Field { Field(tag, .secret(s)) }

    package var encodedCount: Int {
        switch value {
        case .bytes(let b): 5 + b.count
        case .secret(let s): 5 + s.count
        case .nested(let fs): 5 + fs.reduce(0) { $0 + $1.encodedCount }
        }
    }

    /// Writes this field at `offset`, returns the offset after it.
    func write(into out: UnsafeMutableRawBufferPointer, at offset: Int) -> Int {
        let length = encodedCount - 5
        out[offset] = tag
        for i in 0..<4 { out[offset + 1 + i] = UInt8(truncatingIfNeeded: length >> (24 - 8 * i)) }
        var at = offset + 5
        switch value {
        case .bytes(let b):
            b.withUnsafeBytes { raw in
                if raw.count > 0 { (out.baseAddress! + at).copyMemory(from: raw.baseAddress!, byteCount: raw.count) }
            }
            at += b.count
        case .secret(let s):
            s.withUnsafeBytes { raw in
                if raw.count > 0 { (out.baseAddress! + at).copyMemory(from: raw.baseAddress!, byteCount: raw.count) }
            }
            at += s.count
        case .nested(let fs):
            for f in fs { at = f.write(into: out, at: at) }
        }
        return at
    }
}

/// Builds a payload: protocol version, message type, fields. Guarded memory, since fields may
/// be secret.
public enum PayloadEncoder {
    public static func encode(type: UInt8, fields: [Field]) -> SecureBytes {
        let size = 2 + fields.reduce(0) { $0 + $1.encodedCount }
        let out = SecureBytes(count: size)
        out.withUnsafeMutableBytes { buf in
            buf[0] = ProtocolVersion.current
            buf[1] = type
            var at = 2
            for f in fields { at = f.write(into: buf, at: at) }
            precondition(at == size)
        }
        return out
    }
}

public enum ProtocolVersion {
    public static let current: UInt8 = 1
}

/// A set of field tags: every field of every received frame is checked against one.
public typealias TagSet = Set<UInt8>

/// The fields of a received payload (or of one nested field), as ranges into its buffer.
public struct FieldSet {
    let buffer: SecureBytes
    let entries: [(tag: UInt8, start: Int, count: Int)]

    /// Parses `[start, end)` of `buffer` as fields. Tags not in `allowed` are malformed, as are
    /// repeats of a tag not in `repeatable`.
    init(buffer: SecureBytes, start: Int, end: Int, allowed: TagSet, repeatable: TagSet = []) throws(FrameError) {
        var entries: [(UInt8, Int, Int)] = []
        var seen = TagSet()
        var at = start
        try buffer.withUnsafeBytes { (raw) throws(FrameError) in
            while at < end {
                guard end - at >= 5 else { throw .malformed("field header cut short") }
                let tag = raw[at]
                var length = 0
                for i in 0..<4 { length = length << 8 | Int(raw[at + 1 + i]) }
                let valueStart = at + 5
                guard length <= end - valueStart else { throw .malformed("field length beyond frame") }
                guard allowed.contains(tag) else { throw .malformed("unknown field \(tag)") }
                if seen.contains(tag) && !repeatable.contains(tag) { throw .malformed("repeated field \(tag)") }
                seen.insert(tag)
                entries.append((tag, valueStart, length))
                at = valueStart + length
            }
        }
        self.buffer = buffer
        self.entries = entries
    }

    /// The top-level fields of a payload, after checking version and message type.
    public static func payload(_ payload: SecureBytes, allowed: TagSet, repeatable: TagSet = []) throws(FrameError) -> FieldSet {
        try FieldSet(buffer: payload, start: 2, end: payload.count, allowed: allowed, repeatable: repeatable)
    }

    /// Version and type of a payload; a payload of another protocol version is refused.
    public static func header(_ payload: SecureBytes) throws(FrameError) -> UInt8 {
        guard payload.count >= 2 else { throw .malformed("frame too short") }
        let (version, type) = payload.withUnsafeBytes { ($0[0], $0[1]) }
        guard version == ProtocolVersion.current else { throw .unsupportedVersion(version) }
        return type
    }

    public func has(_ tag: UInt8) -> Bool { entries.contains { $0.tag == tag } }

    private func bytes(_ entry: (tag: UInt8, start: Int, count: Int)) -> [UInt8] {
        buffer.withUnsafeBytes { Array($0[entry.start..<(entry.start + entry.count)]) }
    }

    public func text(_ tag: UInt8, maxBytes: Int = Limits.maxTextBytes) throws(FrameError) -> String? {
        guard let e = entries.first(where: { $0.tag == tag }) else { return nil }
        return try decodeText(e, maxBytes: maxBytes)
    }

    public func requiredText(_ tag: UInt8, maxBytes: Int = Limits.maxTextBytes) throws(FrameError) -> String {
        guard let t = try text(tag, maxBytes: maxBytes) else { throw .malformed("missing field \(tag)") }
        return t
    }

    public func texts(_ tag: UInt8, maxBytes: Int = Limits.maxTextBytes) throws(FrameError) -> [String] {
        var out: [String] = []
        for e in entries where e.tag == tag { out.append(try decodeText(e, maxBytes: maxBytes)) }
        return out
    }

    private func decodeText(_ e: (tag: UInt8, start: Int, count: Int), maxBytes: Int) throws(FrameError) -> String {
        guard e.count <= maxBytes else { throw .malformed("text field \(e.tag) too long") }
        // Validated straight from the frame buffer: no intermediate copy per field.
        let decoded: String? = buffer.withUnsafeBytes { raw in
            let slice = UnsafeRawBufferPointer(rebasing: raw[e.start..<(e.start + e.count)]).bindMemory(to: UInt8.self)
            guard !slice.contains(0) else { return nil }
            return String(validating: slice, as: UTF8.self)
        }
        guard let s = decoded else { throw .malformed("text field \(e.tag) is not valid UTF-8") }
        return s
    }

    public func number(_ tag: UInt8) throws(FrameError) -> UInt64? {
        guard let e = entries.first(where: { $0.tag == tag }) else { return nil }
        guard e.count == 8 else { throw .malformed("number field \(tag) has \(e.count) bytes") }
        return bytes(e).reduce(0) { $0 << 8 | UInt64($1) }
    }

    public func flag(_ tag: UInt8) throws(FrameError) -> Bool {
        guard let e = entries.first(where: { $0.tag == tag }) else { return false }
        guard e.count == 1, bytes(e) == [1] else { throw .malformed("flag field \(tag) malformed") }
        return true
    }

    public func opaque(_ tag: UInt8, maxBytes: Int) throws(FrameError) -> [UInt8]? {
        guard let e = entries.first(where: { $0.tag == tag }) else { return nil }
        guard e.count <= maxBytes else { throw .malformed("field \(tag) too long") }
        return bytes(e)
    }

    /// A secret field copied straight into guarded memory.
    public func secret(_ tag: UInt8, maxBytes: Int) throws(FrameError) -> SecureBytes? {
        guard let e = entries.first(where: { $0.tag == tag }) else { return nil }
        guard e.count <= maxBytes else { throw .malformed("secret field exceeds \(maxBytes) bytes") }
        return buffer.withUnsafeBytes { SecureBytes(copying: UnsafeRawBufferPointer(rebasing: $0[e.start..<(e.start + e.count)])) }
    }

    public func nested(_ tag: UInt8, allowed: TagSet, repeatable: TagSet = []) throws(FrameError) -> [FieldSet] {
        var out: [FieldSet] = []
        for e in entries where e.tag == tag {
            out.append(try FieldSet(buffer: buffer, start: e.start, end: e.start + e.count, allowed: allowed, repeatable: repeatable))
        }
        return out
    }
}
