import Foundation
import Glibc
import Testing
import KeyholdCore
@testable import KeyholdCredentialHelpers
import KeyholdTestSupport

/// The helper's `url=` parser against git itself (issue 36 item 4): each URL goes to the real
/// `git credential fill`, whose answer (the fields git parsed, or its refusal) is the oracle.
@Suite struct GitURLOracleTests {
    static let helperUser = "oracle-helper-user"
    static let helperPassword = "oracle-helper-password"

    /// Hostile and odd URLs: authority cut by `?`/`#`, several `@`, colons, escapes, newlines.
    static let urls = [
        "https://alice:x@evil.example#@github.com",
        "https://alice:x@evil.example?@github.com",
        "https://alice@evil.example#@github.com/",
        "https://evil.example?x=@github.com",
        "https://evil.example#github.com",
        "https://alice:x@evil.example/@github.com",
        "https://a@b@github.com/",
        "https://a:b:c@github.com/r.git",
        "https://a@github.com:b@evil/",
        "https://github.com:443@evil.example/",
        "https://alice:x@github.com",
        "https://alice@github.com/org/repo.git/",
        "https://@github.com/",
        "https://:pw@github.com/",
        "https://gith%75b.com/",
        "https://gith%75b.com:443/",
        "https://evil%2eexample%23@github.com/",
        "https://evil%40github.com/",
        "https://al%69ce@github.com/",
        "https://a%00b@github.com/",
        "https://a%4@github.com/%",
        "https://a%0ab@github.com/",
        "https://github.com%0a/",
        "https://github.com/a%0ab",
        "https://github.com/a:%41/b//",
        "https:///path/only",
        "https://",
        "https://github.com//",
        "https://github.com#",
        "https://github.com?",
        "cert:///etc/ssl/x.pem",
        "noscheme.example/x",
        "://github.com/",
        "github.com:org/repo.git",
        "ssh://git@github.com:22/org/repo",
        "a/b@c://github.com/",
        "https://a%ffb@github.com/",
        "https://h\u{e9}te.example/",
    ]

    struct GitParse: Equatable {
        var protocolName: String?, host: String?, path: String?, username: String?, password: String?
    }

    /// What git makes of `url`: nil when it refuses it. The helper answers only what git lacks,
    /// with markers, so git's own output is exactly its parse.
    func git(_ url: String) -> (parse: GitParse?, raw: [UInt8]) {
        let helper = "!f() { u=; while IFS= read -r l && [ -n \"$l\" ]; do case \"$l\" in username=*) u=1;; esac; done; "
            + "[ -n \"$u\" ] || echo username=\(Self.helperUser); echo password=\(Self.helperPassword); }; f"
        let r = runCommand("/usr/bin/git", ["-c", "credential.useHttpPath=true", "-c", "credential.helper=" + helper, "credential", "fill"],
                           stdin: Array("url=\(url)\n\n".utf8),
                           environment: ["HOME": "/nonexistent", "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null",
                                         "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "", "SSH_ASKPASS": ""])
        if r.status != 0 {
            #expect(r.stderr.contains("credential url cannot be parsed"), "\(url): git failed otherwise: \(r.stderr)")
            return (nil, r.stdout)
        }
        var p = GitParse()
        for line in r.stdoutText.split(separator: "\n", omittingEmptySubsequences: false) where !line.isEmpty {
            let (k, v) = (line.prefix { $0 != "=" }, String(line.drop { $0 != "=" }.dropFirst()))
            switch k {
            case "protocol": p.protocolName = v
            case "host": p.host = v
            case "path": p.path = v
            case "username": p.username = v == Self.helperUser ? nil : v
            case "password": p.password = v == Self.helperPassword ? nil : v
            default: break
            }
        }
        return (p, r.stdout)
    }

    func keyhold(_ url: String) -> Result<GitParse, GitCredentialParseError> {
        let input = Array("url=\(url)\n".utf8).withUnsafeBytes { SecureBytes(copying: $0) }
        do throws(GitCredentialParseError) {
            let c = try GitCredentialProtocol.parse(input)
            defer { c.wipe() }
            return .success(GitParse(protocolName: c.protocolName, host: c.host, path: c.path, username: c.username,
                                     password: c.password.map { $0.withUnsafeBytes { String(decoding: $0, as: UTF8.self) } }))
        } catch {
            return .failure(error)
        }
    }

    @Test(arguments: urls) func readsTheURLAsGitDoes(_ url: String) throws {
        let (oracle, raw) = git(url)
        switch (oracle, keyhold(url)) {
        case (nil, .failure(let e)):
            #expect(e == .badURL(line: 1))
        case (nil, .success(let mine)):
            Issue.record("git refuses \(url) but the helper read \(mine)")
        case (let theirs?, .success(let mine)):
            #expect(mine == theirs, "\(url)")
        case (_?, .failure(let e)):
            // The one stricter rule: a component that decodes to non-UTF-8 bytes.
            #expect(e == .notUTF8(key: "url", line: 1) && String(validating: raw, as: UTF8.self) == nil,
                    "git reads \(url) but the helper refused it: \(e)")
        }
    }

    /// The attack of the issue: no hostile URL maps to github.com.
    @Test func hostileAuthoritiesNeverNameGitHub() throws {
        for url in Self.urls {
            guard case .success(let c) = keyhold(url), c.host == "github.com" else { continue }
            #expect(git(url).parse?.host == "github.com", "\(url) maps to github.com only where git says so")
        }
        #expect(try keyhold("https://alice:x@evil.example#@github.com").get().host == "evil.example")
        #expect(try keyhold("https://alice:x@evil.example?@github.com").get().host == "evil.example")
    }

    /// As git's credential_read: `url=` clears what came before it, and later lines still apply.
    @Test func urlClearsEarlierAttributes() throws {
        let input = Array("password=one\npassword_expiry_utc=99\nusername=u\npath=p\nurl=https://h.example\nusername=later\n".utf8)
            .withUnsafeBytes { SecureBytes(copying: $0) }
        let c = try GitCredentialProtocol.parse(input)
        #expect(c.password == nil && c.passwordExpiryUTC == nil && c.path == nil)
        #expect(c.protocolName == "https" && c.host == "h.example" && c.username == "later")
    }
}
