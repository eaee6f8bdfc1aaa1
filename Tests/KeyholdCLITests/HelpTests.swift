import Testing
@testable import KeyholdCLI

/// The help text's wrapping and the tables' fitting, at fixed widths.
@Suite struct HelpTests {
    @Test func wrappingKeepsEveryWordAndStaysWithinTheWidth() {
        let text = "one two three four five six seven eight nine ten eleven twelve\nthirteen"
        for width in [10, 20, 33] {
            let wrapped = TextWidth.wrap(text, width: width, indent: 2)
            #expect(wrapped.split(separator: "\n").allSatisfy { $0.count <= width }, "\(width): \(wrapped)")
            #expect(wrapped.split(whereSeparator: { $0 == " " || $0 == "\n" }).joined(separator: " ")
                    == text.split(whereSeparator: { $0 == " " || $0 == "\n" }).joined(separator: " "))
        }
        // A word longer than the line stands alone, whole.
        #expect(TextWidth.wrap("a /a/very/long/path b", width: 8) == "a\n/a/very/long/path\nb")
        // `[--reuse SECONDS]` is never split between lines.
        let usage = TextWidth.usageWords(["[--reuse SECONDS]", "[--allow-exe PATH]"], width: 30, firstIndent: 14)
        #expect(usage.contains("[--reuse SECONDS]") && usage.contains("[--allow-exe PATH]"), "\(usage)")
    }

    @Test func everyCommandsHelpFitsNarrowTerminals() {
        let parser = KeyholdCommand.parser
        for width in [40, 72, 100] {
            for text in [parser.mainUsage(width: width)] + (parser.commands + parser.commands.flatMap(\.subcommands)).map({ $0.usage(width: width) }) {
                for line in text.split(separator: "\n") where line.count > width {
                    #expect(!line.trimmingCharacters(in: " ").contains(" "), "\(width): \(line)")
                }
            }
        }
    }

    @Test func tablesNarrowTheWidestColumnsFirst() {
        #expect(Output.fitted([5, 100, 7], into: 40) == [5, 26, 7])
        #expect(Output.fitted([5, 10], into: 40) == [5, 10])
        #expect(Output.fitted([50, 60], into: 41) == [20, 20])
        let table = Output.table([["A", "B"], ["short", String(repeating: "x", count: 50)]], width: 20)
        #expect(table == "A     B\nshort xxxxxxxxxxxxx…\n", "\(table)")
        #expect(Output.cut("abc", to: 3) == "abc" && Output.cut("abcd", to: 3) == "ab…")
    }
}

extension Substring {
    func trimmingCharacters(in character: Character) -> Substring {
        var s = self
        while s.first == character { s = s.dropFirst() }
        while s.last == character { s = s.dropLast() }
        return s
    }
}
