import KeyholdCore

/// Reads one flat JSON object per line: string, integer and null values only, as the export
/// writes them. Strict: duplicate keys, other value kinds or trailing bytes are refused. The
/// file may have been edited by anyone, so every read is bounded.
enum JSONLine {
    enum Value: Equatable {
        case string(String), number(Int64), null
        var string: String? { if case .string(let s) = self { s } else { nil } }
        var number: Int64? { if case .number(let n) = self { n } else { nil } }
    }

    static func parse(_ line: [UInt8]) -> [String: Value]? {
        var p = Parser(bytes: line)
        return p.object()
    }

    private struct Parser {
        let bytes: [UInt8]
        var i = 0

        mutating func skipSpace() {
            while i < bytes.count, [0x20, 0x09, 0x0d].contains(bytes[i]) { i += 1 }
        }

        mutating func eat(_ c: UInt8) -> Bool {
            skipSpace()
            guard i < bytes.count, bytes[i] == c else { return false }
            i += 1
            return true
        }

        mutating func object() -> [String: Value]? {
            guard eat(UInt8(ascii: "{")) else { return nil }
            var out: [String: Value] = [:]
            if eat(UInt8(ascii: "}")) { return atEnd() ? out : nil }
            repeat {
                skipSpace()
                guard let key = string(), eat(UInt8(ascii: ":")), out[key] == nil, let v = value() else { return nil }
                out[key] = v
            } while eat(UInt8(ascii: ","))
            guard eat(UInt8(ascii: "}")), atEnd() else { return nil }
            return out
        }

        mutating func atEnd() -> Bool {
            skipSpace()
            return i == bytes.count
        }

        mutating func value() -> Value? {
            skipSpace()
            guard i < bytes.count else { return nil }
            switch bytes[i] {
            case UInt8(ascii: "\""): return string().map { .string($0) }
            case UInt8(ascii: "n"):
                guard bytes.count - i >= 4, Array(bytes[i..<i + 4]) == Array("null".utf8) else { return nil }
                i += 4
                return .null
            default: return number().map { .number($0) }
            }
        }

        mutating func number() -> Int64? {
            let start = i
            if i < bytes.count, bytes[i] == UInt8(ascii: "-") { i += 1 }
            let digits = i
            while i < bytes.count, (48...57).contains(bytes[i]), i - digits < 19 { i += 1 }
            guard i > digits, i == bytes.count || !(48...57).contains(bytes[i]) else { return nil }
            return Int64(String(decoding: bytes[start..<i], as: UTF8.self))
        }

        mutating func hex4() -> UInt32? {
            guard bytes.count - i >= 4 else { return nil }
            var v: UInt32 = 0
            for _ in 0..<4 {
                let c = bytes[i]
                let n: UInt32
                switch c {
                case 48...57: n = UInt32(c - 48)
                case 97...102: n = UInt32(c - 87)
                case 65...70: n = UInt32(c - 55)
                default: return nil
                }
                v = v << 4 | n
                i += 1
            }
            return v
        }

        mutating func string() -> String? {
            guard i < bytes.count, bytes[i] == UInt8(ascii: "\"") else { return nil }
            i += 1
            var out: [UInt8] = []
            while i < bytes.count {
                let c = bytes[i]
                i += 1
                switch c {
                case UInt8(ascii: "\""):
                    return String(validating: out, as: UTF8.self)
                case UInt8(ascii: "\\"):
                    guard i < bytes.count else { return nil }
                    let e = bytes[i]
                    i += 1
                    switch e {
                    case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): out.append(e)
                    case UInt8(ascii: "n"): out.append(0x0a)
                    case UInt8(ascii: "r"): out.append(0x0d)
                    case UInt8(ascii: "t"): out.append(0x09)
                    case UInt8(ascii: "b"): out.append(0x08)
                    case UInt8(ascii: "f"): out.append(0x0c)
                    case UInt8(ascii: "u"):
                        guard var scalar = hex4() else { return nil }
                        if (0xd800...0xdbff).contains(scalar) {
                            // A surrogate pair: the low half must follow.
                            guard bytes.count - i >= 6, bytes[i] == UInt8(ascii: "\\"), bytes[i + 1] == UInt8(ascii: "u") else { return nil }
                            i += 2
                            guard let low = hex4(), (0xdc00...0xdfff).contains(low) else { return nil }
                            scalar = 0x10000 + ((scalar - 0xd800) << 10) + (low - 0xdc00)
                        }
                        guard let u = Unicode.Scalar(scalar) else { return nil }
                        out.append(contentsOf: Array(String(Character(u)).utf8))
                    default: return nil
                    }
                default:
                    guard c >= 0x20 else { return nil }
                    out.append(c)
                }
            }
            return nil
        }
    }
}
