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
    /// reason or executable cannot rewrite the terminal. With a `width` (the terminal's), the
    /// widest columns are narrowed until a row fits and a longer cell ends in `…`; `--json`
    /// has every value whole.
    static func table(_ rows: [[String]], width: Int? = nil) -> String {
        let clean = rows.map { $0.map { Printable.escape($0) } }
        var widths = [Int](repeating: 0, count: clean.first?.count ?? 0)
        for r in clean { for (i, cell) in r.enumerated() { widths[i] = max(widths[i], cell.count) } }
        if let width { widths = fitted(widths, into: width) }
        var out = ""
        for r in clean {
            var line = ""
            for (i, cell) in r.enumerated() {
                let shown = cut(cell, to: widths[i])
                line += i == r.count - 1 ? shown : shown.padded(to: widths[i] + 1)
            }
            out += line + "\n"
        }
        return out
    }

    /// Column widths capped at the largest common cap that fits `total` columns with one space
    /// between columns; narrow columns keep their width. No column goes below 4 (a row may
    /// then still be wider than a very narrow terminal).
    static func fitted(_ widths: [Int], into total: Int) -> [Int] {
        let budget = total - max(0, widths.count - 1)
        func sum(_ cap: Int) -> Int { widths.reduce(0) { $0 + min($1, cap) } }
        guard sum(Int.max) > budget else { return widths }
        var cap = widths.max() ?? 0
        while cap > 4 && sum(cap) > budget { cap -= 1 }
        // What the cap left unused goes back to the capped columns, left to right.
        var spare = budget - sum(cap)
        return widths.map { w in
            guard w > cap, spare > 0 else { return min(w, cap) }
            let extra = min(spare, w - cap)
            spare -= extra
            return cap + extra
        }
    }

    /// `cell` when it fits `width` characters, else its start and `…`.
    static func cut(_ cell: String, to width: Int) -> String {
        guard cell.count > width else { return cell }
        return String(cell.prefix(max(0, width - 1))) + "…"
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
