import Foundation
import Glibc
import Testing
import KeyholdClient
import KeyholdCore
import KeyholdTestSupport

/// A prompt unlocks what it names, for whom it was made (issue 35, item 2), attacked as the
/// issue's repro does: one unlock the person approved for item A through one client, then
/// another client, in another login session, asking for a different gated item B — it is
/// prompted again (the askpass runs twice in all), and reads neither A nor B without its own
/// prompt. The broker holds each grant, keyed by item and claimed requester.
@Suite(.serialized) struct SecretServiceGrantTests {
    static let client = """
        import sys, secretstorage
        conn = secretstorage.dbus_init()
        c = secretstorage.get_default_collection(conn)
        def item(account):
            return next(iter(c.search_items({"service": "grant", "account": account})))
        def read(account):
            try:
                item(account).get_secret()
                return "released"
            except secretstorage.exceptions.LockedException:
                return "locked"
        mode = sys.argv[1]
        if mode == "unlock-a":
            print("a-before", read("a"), "unlock-a", item("a").unlock(), "a-after", read("a"), "b", read("b"))
        else:
            print("a", read("a"), "b-before", read("b"), "unlock-b", item("b").unlock(), "b-after", read("b"))
        """

    @Test func anUnlockCoversTheItemsItNamedForTheClientThatRanIt() throws {
        let f = try SecretServiceFixture(startAgent: false)
        for account in ["a", "b"] {
            #expect(f.cli(["put", "grant", account, "--policy", "device-passcode", "--reuse", "300"], stdin: "secret-\(account)").status == 0)
        }
        // Each time it is run, the askpass adds a line to `asked` and answers the password.
        let asked = f.directory + "/asked"
        _ = FileManager.default.createFile(atPath: asked, contents: nil)
        chown(asked, f.user.uid, gid_t(f.user.uid))
        let askpass = f.directory + "/counting-askpass"
        _ = FileManager.default.createFile(atPath: askpass, contents: Data("#!/bin/sh\necho asked >> \(asked)\nprintf '%s\\n' right\n".utf8))
        chmod(askpass, 0o755)
        try f.startAgent(environment: ["KEYHOLD_ASKPASS": askpass])
        let script = f.directory + "/grant.py"
        _ = FileManager.default.createFile(atPath: script, contents: Data(Self.client.utf8))
        chmod(script, 0o644)
        func timesAsked() -> Int { f.log("asked").split(separator: "\n").count }

        // Client X unlocks A (the person approves once) and reads it; B stays locked for X.
        let x = f.run("/usr/bin/python3", [script, "unlock-a"])
        #expect(x.stdoutText == "a-before locked unlock-a False a-after released b locked\n", "\(x.stdoutText) \(x.stderr)")
        #expect(timesAsked() == 1)
        // Client Y, in a login session of its own (setsid), inside A's window: A is locked for it,
        // and unlocking B asks the person again.
        let y = f.run("/usr/bin/setsid", ["--wait", "/usr/bin/python3", script, "unlock-b"])
        #expect(y.stdoutText == "a locked b-before locked unlock-b False b-after released\n", "\(y.stdoutText) \(y.stderr)")
        #expect(timesAsked() == 2, "the askpass ran \(timesAsked()) times")
    }

    /// The broker's side, asked directly as the agent asks it: one interactive read of A for a
    /// claimed requester P opens a window for P and A only. A later read without a prompt is
    /// released for P and A, and refused for P and B, for another live process Q and A, and
    /// for the caller itself with no claim.
    @Test func theBrokerKeysAPromptsGrantByItemAndClaimedRequester() throws {
        final class Answer: Interaction {
            var asked = 0
            func answer(_ prompt: Prompt) -> SecureBytes? {
                asked += 1
                return SecureBytes(copying: Array("right-password".utf8))
            }
            func show(_ notice: Notice) {}
        }
        let f = try BrokerFixture()
        let vault = Vault(socketPath: f.socketPath)
        for account in ["a", "b"] {
            try vault.add(SecureBytes(copying: Array("secret-\(account)".utf8)), service: "grant", account: account,
                          access: AccessControl(policy: try Policy(parsing: "device-passcode"), reuseSeconds: 300))
        }
        let other = Process()
        other.executableURL = URL(fileURLWithPath: "/bin/sleep")
        other.arguments = ["60"]
        try other.run()
        defer { kill(other.processIdentifier, SIGKILL); other.waitUntilExit() }
        let p = getpid(), q = other.processIdentifier
        let answer = Answer()
        _ = try vault.secret(service: "grant", account: "a", claimedPID: p, reason: "unlock", interaction: answer)
        #expect(answer.asked == 1)
        func released(_ account: String, _ claim: Int32?) -> String {
            let read = Result { () throws(KeyholdError) -> SecureBytes in
                if let claim { return try vault.secret(service: "grant", account: account, claimedPID: claim) }
                return try vault.secret(service: "grant", account: account)
            }
            switch read {
            case .success(let s): s.wipe(); return "released"
            case .failure(let error): return "\(error)"
            }
        }
        #expect(released("a", p) == "released")
        #expect(released("b", p).hasPrefix("interaction not allowed"), "\(released("b", p))")
        #expect(released("a", q).hasPrefix("interaction not allowed"), "\(released("a", q))")
        #expect(released("a", nil).hasPrefix("interaction not allowed"), "\(released("a", nil))")
        #expect(answer.asked == 1)
    }
}
