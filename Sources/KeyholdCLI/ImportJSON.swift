import KeyholdClient
import KeyholdCore

/// A strict, bounded JSON reader for the one nested file an import reads (docker's
/// config.json). Strings stay where they are in the (guarded) input, as ranges, until a caller
/// decodes one: a secret into guarded memory, a name into a String. Any file may be hostile:
/// depth and size are bounded and every error names only a byte offset.
enum ImportJSON {
    indirect enum Value {
        case object([(key: String, value: Value)])
        case string(Range<Int>)   // the literal's bytes between its quotes, still escaped
        case other                // arrays, numbers, true, false, null: checked, not kept
    }

    static let maxDepth = 32

    static func parse(_ raw: UnsafeRawBufferPointer) -> Result<Value, KeyholdError> {
        var p = Parser(raw: raw)
        guard let v = p.value(depth: 0) else { return .failure(.invalidRequest("not valid JSON (at byte \(p.at))")) }
        p.space()
        guard p.at == raw.count else { return .failure(.invalidRequest("not valid JSON (at byte \(p.at))")) }
        return .success(v)
    }

    /// A string literal's content decoded into guarded memory; nil when it is not valid.
    static func secret(_ raw: UnsafeRawBufferPointer, _ range: Range<Int>) -> SecureBytes? {
        let out = SecureBytes(count: range.count)
        defer { out.wipe() }
        guard let n = out.withUnsafeMutableBytes({ decode(raw, range, into: $0) }) else { return nil }
        return out.withUnsafeBytes { SecureBytes(copying: UnsafeRawBufferPointer(rebasing: $0[0..<n])) }
    }

    /// A string literal's content as text (a name, not a secret).
    static func text(_ raw: UnsafeRawBufferPointer, _ range: Range<Int>) -> String? {
        var out = [UInt8](repeating: 0, count: range.count)
        guard let n = out.withUnsafeMutableBytes({ decode(raw, range, into: $0) }) else { return nil }
        return ImportInput.name(out[0..<n])
    }

    /// Unescapes (`\"` `\\` `\/` `\b` `\f` `\n` `\r` `\t` `\uXXXX`, surrogate pairs) into `o`,
    /// which is at least as long as the range; the decoded length, nil if invalid or not UTF-8.
    static func decode(_ raw: UnsafeRawBufferPointer, _ range: Range<Int>, into o: UnsafeMutableRawBufferPointer) -> Int? {
        var i = range.lowerBound, n = 0
        func hex4() -> UInt32? {
            guard i + 4 <= range.upperBound else { return nil }
            var v: UInt32 = 0
            for k in 0..<4 {
                guard let d = Character(Unicode.Scalar(raw[i + k])).hexDigitValue else { return nil }
                v = v << 4 | UInt32(d)
            }
            i += 4
            return v
        }
        while i < range.upperBound {
            let b = raw[i]
            i += 1
            guard b == UInt8(ascii: "\\") else { o[n] = b; n += 1; continue }
            guard i < range.upperBound else { return nil }
            let e = raw[i]
            i += 1
            let simple: [UInt8: UInt8] = [0x22: 0x22, 0x5c: 0x5c, 0x2f: 0x2f, 0x62: 8, 0x66: 12, 0x6e: 10, 0x72: 13, 0x74: 9]
            if let c = simple[e] { o[n] = c; n += 1; continue }
            guard e == UInt8(ascii: "u"), var u = hex4() else { return nil }
            if (0xD800..<0xDC00).contains(u) {
                guard i + 2 <= range.upperBound, raw[i] == 0x5c, raw[i + 1] == UInt8(ascii: "u") else { return nil }
                i += 2
                guard let lo = hex4(), (0xDC00..<0xE000).contains(lo) else { return nil }
                u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00)
            }
            guard let scalar = Unicode.Scalar(u) else { return nil }
            for byte in String(scalar).utf8 { o[n] = byte; n += 1 }
        }
        guard String(validating: UnsafeRawBufferPointer(rebasing: o[0..<n]), as: UTF8.self) != nil else { return nil }
        return n
    }

    private struct Parser {
        let raw: UnsafeRawBufferPointer
        var at = 0

        mutating func space() {
            while at < raw.count, [0x20, 0x09, 0x0a, 0x0d].contains(raw[at]) { at += 1 }
        }

        mutating func eat(_ c: UInt8) -> Bool {
            space()
            guard at < raw.count, raw[at] == c else { return false }
            at += 1
            return true
        }

        mutating func value(depth: Int) -> Value? {
            guard depth < ImportJSON.maxDepth else { return nil }
            space()
            guard at < raw.count else { return nil }
            switch raw[at] {
            case UInt8(ascii: "\""): return string().map { .string($0) }
            case UInt8(ascii: "{"):
                at += 1
                var members: [(key: String, value: Value)] = []
                if eat(UInt8(ascii: "}")) { return .object(members) }
                repeat {
                    space()
                    guard let k = string(), let key = ImportJSON.text(raw, k), eat(UInt8(ascii: ":")),
                          let v = value(depth: depth + 1) else { return nil }
                    members.append((key, v))
                } while eat(UInt8(ascii: ","))
                return eat(UInt8(ascii: "}")) ? .object(members) : nil
            case UInt8(ascii: "["):
                at += 1
                if eat(UInt8(ascii: "]")) { return .other }
                repeat {
                    guard value(depth: depth + 1) != nil else { return nil }
                } while eat(UInt8(ascii: ","))
                return eat(UInt8(ascii: "]")) ? .other : nil
            default:
                let start = at
                while at < raw.count, (0x30...0x39).contains(raw[at]) || "-+.eEtrufalsn".utf8.contains(raw[at]) { at += 1 }
                let word = String(decoding: UnsafeRawBufferPointer(rebasing: raw[start..<at]), as: UTF8.self)
                return word == "true" || word == "false" || word == "null" || Double(word) != nil ? .other : nil
            }
        }

        /// The range of a string literal's content; escapes are only skipped here, checked when decoded.
        mutating func string() -> Range<Int>? {
            guard at < raw.count, raw[at] == UInt8(ascii: "\"") else { return nil }
            let start = at + 1
            var i = start
            while i < raw.count, raw[i] != UInt8(ascii: "\"") {
                guard raw[i] >= 0x20 else { return nil }
                i += raw[i] == UInt8(ascii: "\\") ? 2 : 1
            }
            guard i < raw.count else { return nil }
            at = i + 1
            return start..<i
        }
    }
}

extension ImportJSON.Value {
    func member(_ name: String) -> ImportJSON.Value? {
        guard case .object(let members) = self else { return nil }
        return members.last { $0.key == name }?.value
    }

    var stringRange: Range<Int>? {
        if case .string(let r) = self { r } else { nil }
    }
}
