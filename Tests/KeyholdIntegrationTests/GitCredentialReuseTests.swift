import Foundation
import Glibc
import Testing
import KeyholdTestSupport

/// Issue 12: `git-credential-keyhold --policy … --reuse SECONDS`, configured in git as a user
/// would (`credential.helper = keyhold --policy device-passcode --reuse 60`).
@Suite struct GitCredentialReuseTests {
    @Test func storeKeepsPolicyAndReuseAndFillPromptsOncePerSession() throws {
        let b = try BrokerFixture()
        let g = try GitClient(b, helper: "keyhold --policy device-passcode --reuse 60")
        let service = "git:https://git.example"
        #expect(g.credential("approve", ["protocol=https", "host=git.example", "username=alice", "password=gated-pw"]).status == 0)
        let listed = b.cli(["ls", "--json"]).stdoutText.split(separator: "\n").compactMap {
            try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]
        }
        #expect(listed.count == 1)
        #expect(listed.first?["service"] as? String == service && listed.first?["account"] as? String == "alice")
        #expect(listed.first?["policy"] as? String == "device-passcode")
        #expect(listed.first?["reuse_seconds"] as? Int == 60)

        // Two fills and a state in one login session: the broker's prompt comes once, through
        // GIT_ASKPASS (it logs each prompt); the second fill is inside the window.
        let log = b.directory + "/prompts"
        let ask = g.askpass("pam", answer: "right-password", log: log)
        let fill = "printf 'protocol=https\\nhost=git.example\\n\\n' | git credential fill"
        let r = b.script("""
            KH state '\(service)' alice
            \(fill); echo "first=$?"
            KH state '\(service)' alice
            \(fill); echo "second=$?"
            """, environment: g.environment(["GIT_ASKPASS": ask]))
        // The password is masked before comparing, so a failure never prints it.
        let shown = r.stdoutText.replacingOccurrences(of: "gated-pw", with: "<stored>")
        let answer = "protocol=https\nhost=git.example\nusername=alice\npassword=<stored>\n"
        #expect(shown == "requires-authentication\n\(answer)first=0\navailable\n\(answer)second=0\n", "\(r.stderr)")
        #expect(lines(log).count == 1, "one prompt: \(lines(log))")

        // The grants: a password, then the window.
        let methods = b.cli(["audit", "--json", "--item", "\(service)/alice"]).stdoutText.split(separator: "\n").compactMap { line -> String? in
            guard let e = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any],
                  e["operation"] as? String == "get", e["decision"] as? String == "granted" else { return nil }
            return e["method"] as? String
        }
        #expect(methods == ["password", "reuse"])

        // Another session has no window: with no way to prompt, nothing is released.
        let other = helper("git-credential-keyhold", ["get"], stdin: "protocol=https\nhost=git.example\nusername=alice\n", broker: b)
        #expect(other.status == 0 && other.stdout.isEmpty && other.stderr.contains("needs authentication"), "\(other.stderr)")
    }
}
