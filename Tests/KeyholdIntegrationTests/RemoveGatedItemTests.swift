import Foundation
import Testing
import KeyholdCore
import KeyholdVault
import KeyholdTestSupport

/// Issue 8, item 5: a same-user program must not replace a gated item (say a refresh token)
/// with its own by `rm` followed by `put`. Removing needs the item's policy, as `--update` does;
/// a damaged item needs its owner's password. Run as the unprivileged test user.
@Suite(.serialized) struct RemoveGatedItemTests {
    @Test func rmThenPutOfAGatedItemIsRefusedWithoutItsPolicy() throws {
        let user = try TestUser()
        let b = try BrokerFixture(passwords: ["root": "right-password", user.name: "user-password"])
        func cli(_ args: [String], stdin: [UInt8] = [], askpass: String? = nil) -> CommandResult {
            b.cli(args, stdin: stdin, environment: askpass.map { ["KEYHOLD_ASKPASS": $0] } ?? [:], asUser: user.name)
        }
        let right = b.askpass(answering: "user-password", name: "right")
        let wrong = b.askpass(answering: "guess", name: "wrong")
        #expect(cli(["put", "github.com", "me", "--policy", "device-passcode"], stdin: Array("real-refresh-token".utf8)).status == 0)

        // The attack: remove it without the person, then store the attacker's token unprotected.
        #expect(cli(["rm", "github.com", "me"]).status == 7)                       // no terminal, no askpass
        #expect(cli(["rm", "github.com", "me", "--no-interaction"], askpass: right).status == 7)
        #expect(cli(["rm", "github.com", "me"], askpass: wrong).status == 6)
        #expect(cli(["put", "github.com", "me"], stdin: Array("attacker-token".utf8)).status == 4)
        expectSecret(cli(["get", "github.com", "me"], askpass: right).stdoutText, equals: "real-refresh-token")

        // An allowed-executable item: only that program may remove it.
        #expect(cli(["put", "pinned", "me", "--allow-exe", "/usr/bin/git"], stdin: Array("pinned-token".utf8)).status == 0)
        let refused = cli(["rm", "pinned", "me"], askpass: right)
        #expect(refused.status == 10)
        #expect(refused.stderr.contains("not authorized: this program may not read the item"), "\(refused.stderr)")
        #expect(cli(["put", "pinned", "me"], stdin: Array("attacker-token".utf8)).status == 4)

        // The person can remove it: the policy is satisfied, and the audit says how.
        #expect(cli(["rm", "github.com", "me", "--reason", "rotate"], askpass: right).status == 0)
        #expect(cli(["state", "github.com", "me"]).stdoutText == "not-found\n")
        let audit = cli(["audit", "--json", "--item", "github.com/me"]).stdoutText
        #expect(audit.contains("\"operation\":\"delete\",") || audit.contains("\"operation\":\"delete\""))
        #expect(audit.split(separator: "\n").contains { $0.contains("\"operation\":\"delete\"") && $0.contains("\"method\":\"password\"")
            && $0.contains("\"outcome\":\"ok\"") }, "\(audit)")
        // A `none` item is still removed without a prompt.
        #expect(cli(["put", "plain", "me"], stdin: [1]).status == 0)
        #expect(cli(["rm", "plain", "me", "--no-interaction"]).status == 0)
    }

    @Test func aDamagedItemIsClearedByItsOwnerAfterAPassword() throws {
        let user = try TestUser()
        let b = try BrokerFixture(passwords: ["root": "right-password", user.name: "user-password"])
        #expect(b.cli(["put", "victim", "me", "--policy", "device-passcode"], stdin: [1], asUser: user.name).status == 0)
        b.stop()
        do {
            let db = try Database(path: b.stateDirectory + "/vault.db")
            try db.execute("UPDATE items SET policy = 'none'")
            db.close()
        }
        try b.start()
        #expect(b.cli(["get", "victim", "me", "--no-interaction"], asUser: user.name).status == 13)
        #expect(b.cli(["rm", "victim", "me"], asUser: user.name).status == 7)
        #expect(b.cli(["rm", "victim", "me"], environment: ["KEYHOLD_ASKPASS": b.askpass(answering: "guess", name: "w")],
                      asUser: user.name).status == 6)
        let ok = b.cli(["rm", "victim", "me"], environment: ["KEYHOLD_ASKPASS": b.askpass(answering: "user-password", name: "r")],
                       asUser: user.name)
        #expect(ok.status == 0, "\(ok.stderr)")
        #expect(b.cli(["state", "victim", "me"], asUser: user.name).stdoutText == "not-found\n")
    }
}
