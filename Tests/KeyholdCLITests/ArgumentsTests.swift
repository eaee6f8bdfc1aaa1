import Testing
@testable import KeyholdCLI

@Suite struct ArgumentsTests {
    let parser = KeyholdCommand.parser

    @Test func putWithEveryOption() throws {
        let (globals, c) = try parser.parse(["--socket", "/tmp/s", "put", "svc", "acct", "--label=L", "--kind", "password",
                                             "--policy", "device-passcode", "--reuse", "30", "--allow-exe", "/a", "--allow-exe", "/b", "--update"])
        #expect(globals["--socket"] == "/tmp/s")
        #expect(c.name == "put" && c.positionals == ["svc", "acct"])
        #expect(c.value("--label") == "L" && c.value("--kind") == "password" && c.value("--reuse") == "30")
        #expect(c.all("--allow-exe") == ["/a", "/b"] && c.flag("--update"))
    }

    @Test func subcommandsAndDoubleDash() throws {
        #expect(try parser.parse(["audit", "verify"]).command.name == "audit verify")
        #expect(try parser.parse(["audit", "export", "--until", "now", "f.jsonl"]).command.positionals == ["f.jsonl"])
        #expect(try parser.parse(["get", "--", "-svc", "acct"]).command.positionals == ["-svc", "acct"])
    }

    @Test func errors() {
        #expect(throws: ArgumentError.noCommand) { try parser.parse([]) }
        #expect(throws: ArgumentError.unknownCommand("steal")) { try parser.parse(["steal"]) }
        #expect(throws: ArgumentError.unknownOption(command: "get", option: "--secret")) { try parser.parse(["get", "s", "a", "--secret", "x"]) }
        #expect(throws: ArgumentError.missingValue("--reason")) { try parser.parse(["get", "s", "a", "--reason"]) }
        #expect(throws: ArgumentError.repeated("--label")) { try parser.parse(["put", "s", "a", "--label", "x", "--label", "y"]) }
        #expect(throws: ArgumentError.unexpectedValue("--update")) { try parser.parse(["put", "s", "a", "--update=yes"]) }
        #expect(throws: ArgumentError.wrongPositionals(command: "get", expected: ["SERVICE", "ACCOUNT"])) { try parser.parse(["get", "s"]) }
        #expect(throws: ArgumentError.unknownOption(command: "keyhold", option: "--sock")) { try parser.parse(["--sock", "x", "ls"]) }
    }

    @Test func helpForEveryCommand() {
        for spec in parser.commands + parser.commands.flatMap(\.subcommands) {
            let words = spec.name.split(separator: " ").map(String.init)
            do {
                _ = try parser.parse(words + ["--help"])
                Issue.record("\(spec.name) --help did not produce help")
            } catch .help(let text) {
                #expect(text.hasPrefix("usage: keyhold \(spec.name)"))
            } catch {
                Issue.record("\(spec.name): \(error)")
            }
        }
        #expect(throws: ArgumentError.help(parser.mainUsage)) { try parser.parse(["--help"]) }
    }

    @Test func times() {
        #expect(Time.parse("1970-01-01T00:00:00Z") == 0)
        #expect(Time.parse("2026-12-02") == 1_796_169_600_000_000)
        #expect(Time.parse("2026-12-02T00:00:01.5Z") == 1_796_169_601_500_000)
        #expect(Time.parse("@10") == 10_000_000)
        #expect(Time.iso8601(1_796_169_601_500_000) == "2026-12-02T00:00:01.500000Z")
        for bad in ["", "yesterday", "2026-13-01", "2026-12-02T25:00:00Z", "2026-12-02T10:00:00", "@x"] {
            #expect(Time.parse(bad) == nil, "\(bad)")
        }
    }

    @Test func jsonEscaping() {
        #expect(JSON.quote("a\"b\\c\n\u{1}") == "\"a\\\"b\\\\c\\n\\u0001\"")
        // C1 and bidi controls too, as \u escapes (surrogate pairs beyond the BMP): lossless JSON.
        #expect(JSON.quote("\u{85}\u{202e}\u{e0041}") == "\"\\u0085\\u202e\\udb40\\udc41\"")
    }
}
