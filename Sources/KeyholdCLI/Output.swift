import Glibc
import KeyholdCore
import KeyholdProtocol

enum Output {
    static func out(_ text: String) { write(1, text) }

    /// One clear line on stderr. Escaped whole: messages quote arguments, paths and the
    /// broker's words, any of which a caller may have chosen.
    static func err(_ text: String) { write(2, "keyhold: \(Printable.escape(text))\n") }

    static func write(_ fd: Int32, _ text: String) { DescriptorIO.writeAll(fd, text) }

    /// Columns padded to their widest cell. Every cell is escaped so a crafted service name,
    /// reason or executable cannot rewrite the terminal.
    static func table(_ rows: [[String]]) -> String {
        let clean = rows.map { $0.map { Printable.escape($0) } }
        var widths = [Int](repeating: 0, count: clean.first?.count ?? 0)
        for r in clean { for (i, cell) in r.enumerated() { widths[i] = max(widths[i], cell.count) } }
        var out = ""
        for r in clean {
            var line = ""
            for (i, cell) in r.enumerated() {
                line += i == r.count - 1 ? cell : cell.padded(to: widths[i] + 1)
            }
            out += line + "\n"
        }
        return out
    }
}

/// What the CLI draws on the terminal during a conversation with the broker. Caller-supplied
/// text is escaped (`Printable`) and cut short; the executable the broker verified comes last,
/// on a line of its own, right above the prompt, where nothing the caller chose can reach it.
extension Output {
    /// How much of a caller's reason, service and account the announce shows.
    static let reasonLimit = 100, nameLimit = 60
    /// A longer executable path shows its start and its end, so neither can be pushed away.
    static let executableLimit = 160

    static func announcement(_ a: Announcement) -> String {
        var out = "keyhold: \(Printable.escape(a.service, limit: nameLimit)) / \(Printable.escape(a.account, limit: nameLimit)) requested"
        if let reason = a.reason, !reason.isEmpty { out += ", reason: \(Printable.escape(reason, limit: reasonLimit))" }
        out += "\nkeyhold: by \(elided(Printable.escape(a.executable), to: executableLimit)) (pid \(a.pid))\n"
        return out
    }

    /// A prompt's text. An application-password prompt quotes the item's names (the caller's
    /// words), so it is escaped whole; an authentication prompt is a PAM module's text, kept
    /// on its lines.
    static func promptText(_ p: Prompt) -> String {
        switch p.purpose {
        case .appPassword: Printable.escape(p.text, limit: 2 * nameLimit + 40)
        case .authentication: moduleLines(p.text)
        }
    }

    /// A PAM module's message (the broker has already dropped control characters from it),
    /// ending in a newline.
    static func moduleText(_ text: String) -> String {
        let lines = moduleLines(text)
        return lines.hasSuffix("\n") ? lines : lines + "\n"
    }

    private static func moduleLines(_ text: String) -> String {
        text.split(separator: "\n", omittingEmptySubsequences: false).map { Printable.escape(String($0), limit: 200) }.joined(separator: "\n")
    }

    /// `text` whole when short enough, else its start, `…` and its end.
    static func elided(_ text: String, to limit: Int) -> String {
        let scalars = Array(text.unicodeScalars)
        guard scalars.count > limit else { return text }
        let head = limit / 3, tail = limit - head - 1
        var out = String.UnicodeScalarView(scalars[0..<head])
        out.append("…")
        out.append(contentsOf: scalars[(scalars.count - tail)...])
        return String(out)
    }
}

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

/// UTC times as ISO 8601 with microseconds, and the forms `--since`/`--until` accept.
public enum Time {
    public static func iso8601(_ micros: Int64) -> String {
        var t = time_t(micros / 1_000_000)
        var tm = tm()
        gmtime_r(&t, &tm)
        let frac = String(micros % 1_000_000)
        func two(_ v: Int32) -> String { v < 10 ? "0\(v)" : "\(v)" }
        return "\(tm.tm_year + 1900)-\(two(tm.tm_mon + 1))-\(two(tm.tm_mday))T\(two(tm.tm_hour)):\(two(tm.tm_min)):\(two(tm.tm_sec))."
            + String(repeating: "0", count: 6 - frac.count) + frac + "Z"
    }

    /// `2026-12-02T10:00:00Z` (fraction allowed), `2026-12-02` (midnight UTC), `@EPOCH`
    /// seconds, or `now`. Returns µs since the epoch.
    public static func parse(_ text: String) -> Int64? {
        if text == "now" {
            var ts = timespec()
            clock_gettime(CLOCK_REALTIME, &ts)
            return Int64(ts.tv_sec) * 1_000_000 + Int64(ts.tv_nsec) / 1000
        }
        if text.hasPrefix("@") { return Int64(text.dropFirst()).map { $0 * 1_000_000 } }
        let chars = Array(text.utf8)
        func num(_ from: Int, _ len: Int) -> Int32? {
            guard from + len <= chars.count else { return nil }
            var v: Int32 = 0
            for c in chars[from..<(from + len)] {
                guard c >= 48 && c <= 57 else { return nil }
                v = v * 10 + Int32(c - 48)
            }
            return v
        }
        guard chars.count >= 10, chars[4] == UInt8(ascii: "-"), chars[7] == UInt8(ascii: "-"),
              let y = num(0, 4), let mo = num(5, 2), let d = num(8, 2), (1...12).contains(mo), (1...31).contains(d) else { return nil }
        var h: Int32 = 0, mi: Int32 = 0, s: Int32 = 0, micros: Int64 = 0
        if chars.count > 10 {
            guard chars.count >= 20, chars[10] == UInt8(ascii: "T"), chars[13] == UInt8(ascii: ":"), chars[16] == UInt8(ascii: ":"),
                  let hh = num(11, 2), let mm = num(14, 2), let ss = num(17, 2), hh < 24, mm < 60, ss < 61 else { return nil }
            h = hh; mi = mm; s = ss
            var i = 19
            if chars[i] == UInt8(ascii: ".") {
                i += 1
                var digits = 0
                while i < chars.count, chars[i] >= 48, chars[i] <= 57 {
                    if digits < 6 { micros = micros * 10 + Int64(chars[i] - 48); digits += 1 }
                    i += 1
                }
                while digits < 6 { micros *= 10; digits += 1 }
            }
            guard i == chars.count - 1, chars[i] == UInt8(ascii: "Z") else { return nil }
        }
        var tm = tm()
        tm.tm_year = y - 1900; tm.tm_mon = mo - 1; tm.tm_mday = d; tm.tm_hour = h; tm.tm_min = mi; tm.tm_sec = s
        let t = timegm(&tm)
        return Int64(t) * 1_000_000 + micros
    }
}
