import Foundation
import Glibc
import Testing
import KeyholdCore
@testable import KeyholdCredentialHelpers
import KeyholdTestSupport

/// The helpers' only parsers of untrusted bytes: git's `key=value` lines and docker's JSON.
/// Hostile input (NULs, huge values, broken syntax) is refused whole and the error text never
/// carries a value.
@Suite struct GitCredentialProtocolTests {
    func bytes(_ s: String) -> SecureBytes { Array(s.utf8).withUnsafeBytes { SecureBytes(copying: $0) } }
    func bytes(_ b: [UInt8]) -> SecureBytes { b.withUnsafeBytes { SecureBytes(copying: $0) } }
    func text(_ s: SecureBytes?) -> String? { s.map { $0.withUnsafeBytes { String(decoding: $0, as: UTF8.self) } } }

    @Test func parsesFieldsIgnoresUnknownAndStopsAtBlankLine() throws {
        let c = try GitCredentialProtocol.parse(bytes(
            "protocol=https\r\nhost=git.example:8443\nwwwauth[]=Basic realm=x\ncapability[]=authtype\n=odd\npath=a/b.git\nusername=al=ice\npassword=p=w\npassword_expiry_utc=1700000000\noauth_refresh_token=rt\n\nusername=after-blank\n"))
        #expect(c.protocolName == "https" && c.host == "git.example:8443" && c.path == "a/b.git")
        #expect(c.username == "al=ice")
        expectSecret(text(c.password), equals: "p=w")
        expectSecret(text(c.oauthRefreshToken), equals: "rt")
        #expect(c.passwordExpiryUTC == 1_700_000_000)
    }

    @Test func lastValueWinsAndURLDecomposes() throws {
        // A url replaces what came before it, its password included (as git's credential_read).
        let c = try GitCredentialProtocol.parse(bytes("password=one\npassword=two\nurl=http://bob:from-url@127.0.0.1:9/r.git\n"))
        expectSecret(text(c.password), equals: "from-url")
        #expect(c.protocolName == "http" && c.host == "127.0.0.1:9" && c.username == "bob" && c.path == "r.git")
        #expect(throws: GitCredentialParseError.badURL(line: 1)) { try GitCredentialProtocol.parse(bytes("url=nohost\n")) }
    }

    @Test func nulByteAnywhereRefusesTheWholeInput() {
        #expect(throws: GitCredentialParseError.nulByte(line: 2)) {
            try GitCredentialProtocol.parse(bytes(Array("protocol=https\npassword=se".utf8) + [0] + Array("cret\n".utf8)))
        }
    }

    @Test func lineWithoutEqualsIsAnErrorNamingNoValue() {
        do {
            _ = try GitCredentialProtocol.parse(bytes("host=x\nhunter2-secret-looking-line\n"))
            Issue.record("accepted")
        } catch {
            #expect(error == .missingEquals(line: 2))
            #expect(!error.description.contains("hunter2"))
        }
    }

    @Test func oversizedAndNonUTF8ValuesAreRefused() throws {
        let maxPassword = "password=" + String(repeating: "p", count: Limits.maxSecretBytes)
        #expect(try GitCredentialProtocol.parse(bytes(maxPassword)).password?.count == Limits.maxSecretBytes)
        #expect(throws: GitCredentialParseError.valueTooLong(key: "password", line: 1, limit: Limits.maxSecretBytes)) {
            try GitCredentialProtocol.parse(bytes(maxPassword + "p"))
        }
        #expect(throws: GitCredentialParseError.valueTooLong(key: "username", line: 1, limit: Limits.maxTextBytes)) {
            try GitCredentialProtocol.parse(bytes("username=" + String(repeating: "u", count: Limits.maxTextBytes + 1)))
        }
        #expect(throws: GitCredentialParseError.notUTF8(key: "host", line: 1)) {
            try GitCredentialProtocol.parse(bytes(Array("host=".utf8) + [0xff, 0xfe]))
        }
        for bad in ["", "-1", "12a", "99999999999999999999", " 5"] {
            #expect(throws: GitCredentialParseError.badExpiry(line: 1)) { try GitCredentialProtocol.parse(bytes("password_expiry_utc=" + bad)) }
        }
        // Unknown attributes are ignored even when huge (the input cap bounds them).
        #expect(try GitCredentialProtocol.parse(bytes("x-huge=" + String(repeating: "x", count: 200_000) + "\nhost=h")).host == "h")
    }

    @Test func inputIsCappedAndEndsAtTheBlankLine() throws {
        signal(SIGPIPE, SIG_IGN)  // the writer outlives our reading
        var fds: [Int32] = [0, 0]
        #expect(pipe(&fds) == 0)
        let writer = Thread { [w = fds[1]] in
            let chunk = [UInt8](repeating: UInt8(ascii: "a"), count: 65536)
            for _ in 0..<((HelperInput.maxBytes / 65536) + 4) { if write(w, chunk, chunk.count) <= 0 { break } }
            close(w)
        }
        writer.start()
        let r = HelperInput.read(fds[0], stopAtBlankLine: true)
        close(fds[0])
        #expect(r.map { $0.count } == .failure(.tooLarge(limit: HelperInput.maxBytes)))

        #expect(pipe(&fds) == 0)
        let input = "host=h\r\n\r\nnot-read"
        _ = write(fds[1], input, input.utf8.count)  // the writer keeps the pipe open, as a person typing does
        let got = HelperInput.read(fds[0], stopAtBlankLine: true)
        close(fds[0]); close(fds[1])
        #expect(try text(got.get()) == "host=h\r\n\r\n")
    }

    @Test func replyRefusesValuesThatWouldBreakTheProtocol() throws {
        #expect(GitCredentialProtocol.reply(username: "a", password: bytes("pw\n"), expiry: nil, refreshToken: nil) == nil)
        #expect(GitCredentialProtocol.reply(username: "a\npassword=x", password: bytes("pw"), expiry: nil, refreshToken: nil) == nil)
        #expect(GitCredentialProtocol.reply(username: "a", password: bytes("pw"), expiry: nil, refreshToken: bytes([0x61, 0])) == nil)
        let ok = try #require(GitCredentialProtocol.reply(username: "a", password: bytes("pw"), expiry: 5, refreshToken: bytes("rt")))
        expectSecret(text(ok), equals: "username=a\npassword=pw\npassword_expiry_utc=5\noauth_refresh_token=rt\n")
    }

    @Test func storedSecretRoundTripsPasswordAndRefreshToken() {
        let plain = CredentialMapping.gitCredential(fromSecret: CredentialMapping.gitSecret(password: bytes("pw"), refreshToken: nil))
        expectSecret(text(plain.password), equals: "pw")
        #expect(plain.refreshToken == nil)
        let blob = CredentialMapping.gitSecret(password: bytes("pw"), refreshToken: bytes("rt=1"))
        let both = CredentialMapping.gitCredential(fromSecret: blob)
        expectSecret(text(both.password), equals: "pw")
        expectSecret(text(both.refreshToken), equals: "rt=1")
        #expect(both.expiry == nil)
        // A blob from before items had an expiry kept it in a line of its own: still read.
        let legacy = CredentialMapping.gitBlobMagic + Array("password=pw\npassword_expiry_utc=9\n".utf8)
        let expiring = CredentialMapping.gitCredential(fromSecret: SecureBytes(copying: legacy))
        expectSecret(text(expiring.password), equals: "pw")
        #expect(expiring.refreshToken == nil && expiring.expiry == 9)
        #expect(CredentialMapping.gitService(protocolName: "https", host: "h:1", path: "r.git") == "git:https://h:1/r.git")
        #expect(CredentialMapping.expiry(fromLabel: CredentialMapping.gitLabel(expiry: 42)) == 42)
        #expect(CredentialMapping.expiry(fromLabel: "git credential") == nil)
    }
}

@Suite struct DockerCredentialProtocolTests {
    func bytes(_ s: String) -> SecureBytes { Array(s.utf8).withUnsafeBytes { SecureBytes(copying: $0) } }
    func text(_ s: SecureBytes) -> String { s.withUnsafeBytes { String(decoding: $0, as: UTF8.self) } }

    @Test func parsesStoreWithEscapesAndSkipsOtherMembers() throws {
        let c = try DockerCredentialProtocol.parseStore(bytes(#"""
            { "Extra": {"a": [1, -2.5e3, true, null, "x\"y"]}, "ServerURL" : "https://r.example/v2/",
              "Username": "<token>", "Secret": "s\u00e9\ud83d\ude00\n\"\\/" , "Other": false }
            """#))
        #expect(c.serverURL == "https://r.example/v2/" && c.username == "<token>")
        expectSecret(text(c.secret), equals: "sé😀\n\"\\/")
    }

    @Test func invalidJSONIsRefusedWithoutEchoingIt() {
        let cases: [String] = [
            "", "{", "[]", #"{"ServerURL":"a","Username":"b","Secret":"c"} trailing"#,
            #"{"Secret":"unterminated"#, "{\"Secret\":\"raw\ncontrol\"}", #"{"Secret":"\x41"}"#,
            #"{"Secret":"\ud800"}"#, #"{"Secret":"\udc00x"}"#, #"{"Secret":"\u12"}"#, #"{"Secret" "c"}"#,
            #"{"a":tru}"#, #"{"a":1,}"#, #"{'Secret':'c'}"#,
        ]
        for input in cases {
            do {
                _ = try DockerCredentialProtocol.parseStore(bytes(input))
                Issue.record("accepted: \(input)")
            } catch {
                if case .invalidJSON = error {} else { Issue.record("\(input): \(error)") }
                #expect(!error.description.contains("unterminated") && !error.description.contains("control"))
            }
        }
        // Invalid UTF-8 inside a string, and nesting beyond the bound.
        let badUTF8 = Array(#"{"Secret":""#.utf8) + [0xc3, 0x28] + Array(#""}"#.utf8)
        #expect(throws: DockerCredentialParseError.self) { try DockerCredentialProtocol.parseStore(badUTF8.withUnsafeBytes { SecureBytes(copying: $0) }) }
        let deep = #"{"a":"# + String(repeating: "[", count: 10_000) + String(repeating: "]", count: 10_000) + "}"
        #expect(throws: DockerCredentialParseError.tooDeep) { try DockerCredentialProtocol.parseStore(bytes(deep)) }
    }

    @Test func missingAndOversizedFieldsAreRefused() {
        #expect(throws: DockerCredentialParseError.missing("server URL")) {
            try DockerCredentialProtocol.parseStore(bytes(#"{"Username":"u","Secret":"s"}"#))
        }
        #expect(throws: DockerCredentialParseError.missing("username")) {
            try DockerCredentialProtocol.parseStore(bytes(#"{"ServerURL":"r","Username":"","Secret":"s"}"#))
        }
        #expect(throws: DockerCredentialParseError.missing("secret")) {
            try DockerCredentialProtocol.parseStore(bytes(#"{"ServerURL":"r","Username":"u","Secret":1}"#))
        }
        let big = String(repeating: "s", count: Limits.maxSecretBytes + 1)
        #expect(throws: DockerCredentialParseError.tooLong("secret", limit: Limits.maxSecretBytes)) {
            try DockerCredentialProtocol.parseStore(bytes(#"{"ServerURL":"r","Username":"u","Secret":"\#(big)"}"#))
        }
    }

    @Test func replyQuotesEverythingAndParsesBack() throws {
        let secret = bytes("a\"b\\c\u{1}\u{7f}d")
        let reply = DockerCredentialProtocol.reply(serverURL: "r\n", username: "<token>", secret: secret)
        let t = text(reply)
        expectSecret(t, equals: #"{"ServerURL":"r\u000a","Username":"<token>","Secret":"a\"b\\c\u0001\u007fd"}"# + "\n")
        let back = try DockerCredentialProtocol.parseStore(reply)
        #expect(back.secret.constantTimeEquals(secret) && back.serverURL == "r\n")
        #expect(DockerCredentialProtocol.listReply([("a\"", "u")]) == #"{"a\"":"u"}"# + "\n")
    }

    @Test func serverURLFormsNameOneRegistry() {
        for form in ["registry.example:5000", "https://registry.example:5000", "http://Registry.Example:5000/v2/", " HTTPS://registry.example:5000/ \n"] {
            #expect(CredentialMapping.dockerHost(form) == "registry.example:5000", "\(form)")
        }
        #expect(CredentialMapping.dockerHost("https://index.docker.io/v1/") == "index.docker.io")
        for bad in ["", "https://", "   ", "/path", "a b"] { #expect(CredentialMapping.dockerHost(bad) == nil, "\(bad)") }
    }
}
