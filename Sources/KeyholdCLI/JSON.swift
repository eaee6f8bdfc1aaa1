import KeyholdCore

/// A tiny JSON writer (the CLI avoids Foundation to start fast).
indirect enum JSON {
    case string(String), number(Int64), bool(Bool), null
    case array([JSON]), objectValue([(String, JSON)])

    static func object(_ pairs: [(String, JSON)]) -> String { JSON.objectValue(pairs).text }

    var text: String {
        switch self {
        case .string(let s): JSON.quote(s)
        case .number(let n): String(n)
        case .bool(let b): b ? "true" : "false"
        case .null: "null"
        case .array(let a): "[" + a.map(\.text).joined(separator: ",") + "]"
        case .objectValue(let pairs): "{" + pairs.map { JSON.quote($0.0) + ":" + $0.1.text }.joined(separator: ",") + "}"
        }
    }

    static func quote(_ s: String) -> String {
        var out = "\""
        for u in s.unicodeScalars {
            switch u {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            default:
                // The same characters the terminal output escapes, as JSON escapes (lossless).
                if Printable.needsEscape(u) {
                    for unit in u.utf16 {
                        let hex = String(unit, radix: 16)
                        out += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
                    }
                } else {
                    out.unicodeScalars.append(u)
                }
            }
        }
        return out + "\""
    }
}
