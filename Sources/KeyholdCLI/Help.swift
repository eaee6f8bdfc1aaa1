import Glibc

/// How wide the help text and the tables may be, and the word wrapping that keeps help text
/// whole at any width (a description is never cut, only moved to the next line).
enum TextWidth {
    /// The terminal's columns when `fd` is one; nil for a pipe or a file.
    static func terminalColumns(_ fd: Int32) -> Int? {
        guard isatty(fd) != 0 else { return nil }
        var size = winsize()
        guard ioctl(fd, UInt(TIOCGWINSZ), &size) == 0, size.ws_col > 0 else { return nil }
        return Int(size.ws_col)
    }

    /// `$COLUMNS` when it holds a plausible width (what a shell exports, and what tests set).
    static var columnsVariable: Int? {
        guard let text = getenv("COLUMNS").map({ String(cString: $0) }), let n = Int(text), n > 0, n < 100_000 else { return nil }
        return n
    }

    /// Help text: the terminal's width, else `$COLUMNS`, else 80; never narrower than 40.
    static var help: Int { max(40, terminalColumns(1) ?? columnsVariable ?? 80) }

    /// A table: the terminal's width (or `$COLUMNS`); nil (no limit) when standard output is
    /// a pipe or a file without `$COLUMNS`, so what a script reads is never cut.
    static var table: Int? {
        if let n = terminalColumns(1) { return max(20, n) }
        return columnsVariable.map { max(20, $0) }
    }

    /// `text` filled to `width` columns: its paragraphs (separated by a blank line) are joined
    /// into one line each and broken at spaces. The first line starts after `firstIndent`
    /// columns already used, the others with `indent` spaces. A word longer than a line stands
    /// on its own line, whole.
    static func wrap(_ text: String, width: Int, indent: Int = 0, firstIndent: Int? = nil) -> String {
        let paragraphs = text.split(separator: "\n\n", omittingEmptySubsequences: false).map {
            $0.split(whereSeparator: { $0 == " " || $0 == "\n" }).map(String.init)
        }
        var out = ""
        var column = firstIndent ?? indent
        let pad = String(repeating: " ", count: indent)
        for (n, words) in paragraphs.enumerated() {
            if n > 0 {
                out += "\n\n" + pad
                column = indent
            }
            var lineHasWord = false
            for word in words {
                let length = word.unicodeScalars.count
                // A first line that starts after other text (`usage: keyhold …`) may break
                // before its first word too.
                if (lineHasWord || column > indent) && column + (lineHasWord ? 1 : 0) + length > width {
                    out += "\n" + pad
                    column = indent
                    lineHasWord = false
                }
                if lineHasWord {
                    out += " "
                    column += 1
                }
                out += word
                column += length
                lineHasWord = true
            }
        }
        return out
    }

    /// Usage words such as `[--reuse SECONDS]`, each kept on one line when wrapped.
    static func usageWords(_ words: [String], width: Int, firstIndent: Int) -> String {
        let glued = words.map { String($0.map { $0 == " " ? "\u{A0}" : $0 }) }.joined(separator: " ")
        return String(wrap(glued, width: width, indent: 8, firstIndent: firstIndent).map { $0 == "\u{A0}" ? " " : $0 })
    }

    /// `left` in a column of `leftWidth`, then `help` wrapped beside it (hanging under itself).
    static func entry(_ left: String, leftWidth: Int, _ help: String, width: Int) -> String {
        let leftColumn = "  " + left
        let start = leftColumn.unicodeScalars.count >= leftWidth - 1 ? leftColumn + "\n" + String(repeating: " ", count: leftWidth)
            : leftColumn + String(repeating: " ", count: leftWidth - leftColumn.unicodeScalars.count)
        return start + wrap(help, width: width, indent: leftWidth) + "\n"
    }
}

/// The first sentence of a command's summary: what `keyhold --help` lists for it, whole.
func firstSentence(_ summary: String) -> String {
    let words = summary.split(whereSeparator: { $0 == " " || $0 == "\n" })
    guard let last = words.firstIndex(where: { $0.hasSuffix(".") }) else { return words.joined(separator: " ") }
    return words[...last].joined(separator: " ")
}
