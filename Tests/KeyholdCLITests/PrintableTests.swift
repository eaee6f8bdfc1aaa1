import Testing
import KeyholdCore
import KeyholdProtocol
@testable import KeyholdCLI

/// The one escaping function, fed what a hostile caller would send to a terminal, and the
/// announce the CLI draws from it.
@Suite struct PrintableTests {
    /// No byte a terminal acts on survives: no C0, DEL or C1, no ESC, nothing Unicode marks as a
    /// format, separator, invisible or unassigned character.
    func isInert(_ s: String) -> Bool {
        !s.unicodeScalars.contains { Printable.needsEscape($0) }
    }

    @Test func terminalControlSequencesAreEscaped() {
        #expect(Printable.escape("\r\u{1b}[2K\u{1b}[1A") == "\\x0d\\x1b[2K\\x1b[1A")
        #expect(Printable.escape("x\u{1b}[2J") == "x\\x1b[2J")
        #expect(Printable.escape("\u{1b}]0;owned\u{07}") == "\\x1b]0;owned\\x07")                  // OSC title
        #expect(Printable.escape("\u{1b}]52;c;ZXZpbA==\u{1b}\\") == "\\x1b]52;c;ZXZpbA==\\x1b\\\\")   // OSC 52 clipboard
        #expect(Printable.escape("\u{9b}2J\u{9d}0;t\u{9c}") == "\\x9b2J\\x9d0;t\\x9c")               // C1 CSI, OSC, ST
        #expect(Printable.escape("a\u{7f}\u{8}\tb\n") == "a\\x7f\\x08\\x09b\\x0a")
        #expect(Printable.escape("\u{0}") == "\\x00")
    }

    @Test func bidiAndInvisibleCharactersAreEscaped() {
        #expect(Printable.escape("exe\u{202e}tig/nib/rsu/") == "exe\\u{202e}tig/nib/rsu/")
        #expect(Printable.escape("\u{2066}a\u{2067}b\u{2068}c\u{2069}") == "\\u{2066}a\\u{2067}b\\u{2068}c\\u{2069}")
        #expect(Printable.escape("git\u{200b}hub\u{200d}\u{200e}\u{200f}") == "git\\u{200b}hub\\u{200d}\\u{200e}\\u{200f}")
        #expect(Printable.escape("\u{feff}\u{2028}\u{2029}\u{61c}\u{ad}") == "\\u{feff}\\u{2028}\\u{2029}\\u{061c}\\u{00ad}")
        #expect(Printable.escape("tag\u{e0041}\u{e007f}") == "tag\\u{e0041}\\u{e007f}")                // Unicode tag characters
        #expect(Printable.escape("\u{3164}\u{115f}x\u{fe0f}") == "\\u{3164}\\u{115f}x\\u{fe0f}")      // fillers, variation selector
    }

    @Test func invalidUTF8BytesAreEscapedOneByOne() {
        #expect(Printable.escape(bytes: [0x66, 0xff, 0x6f]) == "f\\xff" + "o")
        #expect(Printable.escape(bytes: [0xc2, 0x9b, 0x32, 0x4a]) == "\\x9b2J")        // C1 CSI, validly encoded
        #expect(Printable.escape(bytes: [0x9b, 0x32, 0x4a]) == "\\x9b2J")              // a lone continuation byte
        #expect(Printable.escape(bytes: [0xc0, 0x9b]) == "\\xc0\\x9b")                 // overlong
        #expect(Printable.escape(bytes: [0xed, 0xa0, 0x80]) == "\\xed\\xa0\\x80")      // a UTF-16 surrogate
        #expect(Printable.escape(bytes: [0x61, 0xe2, 0x82]) == "a\\xe2\\x82")          // cut short at the end
    }

    @Test func ordinaryTextIsUnchangedAndEscapesAreUnambiguous() {
        for s in ["github.com", "alice@example.org", "Zoë", "日本語のサービス", "🔑 key", "/usr/bin/git", "a b"] {
            #expect(Printable.escape(s) == s)
        }
        // A literal "\x1b" typed by the caller is not confused with an escaped ESC.
        #expect(Printable.escape("\\x1b") == "\\\\x1b")
        #expect(Printable.escape("a b\\", escapingSpaces: true) == "a\\x20b\\\\")
    }

    @Test func limitCutsAndMarks() {
        #expect(Printable.escape(String(repeating: "a", count: 500), limit: 10) == String(repeating: "a", count: 10) + "…")
        #expect(Printable.escape("abc", limit: 3) == "abc")
        // The limit counts what is shown, and never cuts an escape in half.
        #expect(Printable.escape("\u{1b}\u{1b}\u{1b}", limit: 9) == "\\x1b\\x1b…")
        #expect(Printable.escape("\u{202e}abc", limit: 3) == "…")
        #expect(Printable.escape("", limit: 0) == "")
    }

    /// Random bytes and random scalars from the ranges attackers use: the output is inert.
    @Test func randomHostileInputComesOutInert() {
        var rng = SystemRandomNumberGenerator()
        let ranges: [ClosedRange<UInt32>] = [0...0x20, 0x7f...0xa0, 0x2000...0x206f, 0xfe00...0xfeff, 0xe0000...0xe007f, 0x20...0x7e]
        for _ in 0..<2000 {
            let bytes = (0..<Int.random(in: 0...40, using: &rng)).map { _ in UInt8.random(in: 0...255, using: &rng) }
            let fromBytes = Printable.escape(bytes: bytes)
            #expect(isInert(fromBytes), "\(bytes)")
            var scalars = String.UnicodeScalarView()
            for _ in 0..<Int.random(in: 0...40, using: &rng) {
                if let u = Unicode.Scalar(UInt32.random(in: ranges.randomElement(using: &rng)!, using: &rng)) { scalars.append(u) }
            }
            let text = Printable.escape(String(scalars))
            #expect(isInert(text) && !text.contains("\u{1b}"), "\(Array(String(scalars).unicodeScalars))")
        }
    }

    /// The fake line a caller draws in its reason stays inside the caller's line, escaped; the
    /// verified executable is the last line, whatever the caller sends.
    @Test func announceKeepsTheVerifiedExecutableLast() {
        let fake = "deploy\r\u{1b}[2K\u{1b}[1A\u{1b}[1Gkeyhold: by /usr/bin/git (pid 1)\n\u{1b}]0;x\u{7}" + String(repeating: "\n", count: 200)
        let text = Output.announcement(Announcement(executable: "/tmp/evil", pid: 77, service: "svc\n\u{202e}", account: "acct\r", reason: fake))
        let lines = text.split(separator: "\n", omittingEmptySubsequences: false)
        #expect(lines.count == 3 && lines[2].isEmpty, "\(lines)")
        #expect(lines[1] == "keyhold: by /tmp/evil (pid 77)")
        #expect(lines[0].hasPrefix("keyhold: svc\\x0a\\u{202e} / acct\\x0d requested, reason: deploy\\x0d\\x1b[2K\\x1b[1A"))
        #expect(isInert(text.replacingOccurrences("\n", "")))
        #expect(lines[0].count < 250, "the reason is cut short")
        // A path made long to push its start out of view keeps both ends.
        let long = "/tmp/" + String(repeating: "a", count: 4000) + "/usr/bin/git"
        let shown = Output.announcement(Announcement(executable: long, pid: 5, service: "s", account: "a", reason: nil))
        let last = shown.split(separator: "\n")[1]
        #expect(last.hasPrefix("keyhold: by /tmp/aaa") && last.hasSuffix("aaa/usr/bin/git (pid 5)") && last.count < 200)
    }

    @Test func promptsAndModuleTextAreEscaped() {
        let app = Output.promptText(Prompt(style: .echoOff, purpose: .appPassword,
                                           text: "Application password for x\nkeyhold: by /usr/bin/git (pid 1)\n / a: "))
        #expect(!app.contains("\n") && app.contains("x\\x0akeyhold"))
        #expect(Output.promptText(Prompt(style: .echoOff, purpose: .authentication, text: "Password: ")) == "Password: ")
        #expect(Output.moduleText("Place your finger\non the reader") == "Place your finger\non the reader\n")
        #expect(Output.moduleText("x\u{1b}[1A") == "x\\x1b[1A\n")
    }
}

extension String {
    fileprivate func replacingOccurrences(_ a: String, _ b: String) -> String {
        split(separator: Character(a), omittingEmptySubsequences: false).joined(separator: b)
    }
}
