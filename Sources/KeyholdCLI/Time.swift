import Glibc
import KeyholdCore

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
        if text == "now" { return currentMicroseconds() }
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
