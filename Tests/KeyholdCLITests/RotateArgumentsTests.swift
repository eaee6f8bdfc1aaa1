import Testing
import KeyholdCore
@testable import KeyholdCLI

/// `keyhold rotate … -- COMMAND ARGS`: everything after the first `--` is COMMAND, untouched
/// by the option parser (its own `--print` or `--` are its arguments).
@Suite struct RotateArgumentsTests {
    @Test func commandAfterDoubleDashIsNotParsed() throws {
        let args = ["--socket", "/s", "rotate", "idp", "me", "--timeout", "5", "--print", "--", "redeem", "--print", "--", "x"]
        let (options, command) = RotateCommand.split(args)
        #expect(command == ["redeem", "--print", "--", "x"])
        let (_, c) = try KeyholdCommand.parser.parse(options)
        #expect(c.name == "rotate" && c.positionals == ["idp", "me"] && c.value("--timeout") == "5" && c.flag("--print"))
    }

    @Test func otherCommandsKeepTheirDoubleDash() {
        let args = ["get", "--", "-svc", "acct"]
        #expect(RotateCommand.split(args).command == nil && RotateCommand.split(args).options == args)
    }

    @Test func getJSONAndIfGenerationAreOptions() throws {
        #expect(try KeyholdCommand.parser.parse(["get", "s", "a", "--json"]).command.flag("--json"))
        let (_, put) = try KeyholdCommand.parser.parse(["put", "s", "a", "--update", "--if-generation", "3"])
        #expect(put.value("--if-generation") == "3")
        #expect(Output.base64(SecureBytes(copying: Array("any carnal pleas".utf8))) == "YW55IGNhcm5hbCBwbGVhcw==")
        #expect(Output.base64(SecureBytes(copying: Array("ab".utf8))) == "YWI=" && Output.base64(SecureBytes(copying: Array("".utf8))) == "")
    }
}
