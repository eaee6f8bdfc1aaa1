import Foundation
import Glibc
import Testing
import KeyholdClient
import KeyholdCore
import KeyholdTestSupport

/// Search by attributes through the broker's keyed index (issue 11, item 3), with the real
/// broker, agent, secret-tool and SQLite file: exactly the caller's matching items, never
/// another user's, and an index edited while the broker is down never returns a wrong item.
@Suite(.serialized) struct SecretServiceSearchTests {
    /// Secrets `secret-tool search --all` printed, sorted, each ending in a newline.
    static func secrets(_ r: CommandResult) -> String {
        r.stdoutText.split(separator: "\n").compactMap { line in
            line.hasPrefix("secret = ") ? String(line.dropFirst("secret = ".count)) : nil
        }.sorted().map { $0 + "\n" }.joined()
    }

    /// (account, id) of each item `keyhold ls --json` shows the fixture's user.
    static func listed(_ f: SecretServiceFixture) -> [(account: String, id: String)] {
        f.cli(["ls", "--json"]).stdoutText.split(separator: "\n").compactMap { line in
            guard let d = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any],
                  let id = d["id"] as? String, let account = d["account"] as? String else { return nil }
            return (account, id)
        }
    }

    func store(_ f: SecretServiceFixture, _ attributes: [String], _ secret: String) {
        let r = f.secretTool(["store", "--label=\(secret)"] + attributes, stdin: secret)
        #expect(r.status == 0, "\(r.stderr) \(f.log("agent.log"))")
    }

    /// SQL on the closed vault, as someone who can write the file (not the key) would run it.
    func sql(_ f: SecretServiceFixture, _ statements: String) {
        let r = runCommand("/usr/bin/sqlite3", [f.broker.stateDirectory + "/vault.db", statements])
        #expect(r.status == 0, "\(r.stderr)")
    }

    @Test func aSubsetSearchReturnsExactlyTheMatchingItemsAndFollowsTheCLI() throws {
        let f = try SecretServiceFixture()
        store(f, ["application", "app", "user", "ann", "kind", "mail"], "s-ann-mail")
        store(f, ["application", "app", "user", "bob", "kind", "mail"], "s-bob-mail")
        store(f, ["application", "app", "user", "ann", "kind", "chat"], "s-ann-chat")
        store(f, ["application", "other", "user", "ann"], "s-other")
        #expect(f.cli(["put", "bench", "acct-1"], stdin: "s-cli").status == 0)
        expectSecret(Self.secrets(f.secretTool(["search", "--all", "application", "app"])), equals: "s-ann-chat\ns-ann-mail\ns-bob-mail\n")
        expectSecret(Self.secrets(f.secretTool(["search", "--all", "user", "ann", "application", "app"])), equals: "s-ann-chat\ns-ann-mail\n")
        expectSecret(Self.secrets(f.secretTool(["search", "--all", "user", "ann", "kind", "mail", "application", "app"])), equals: "s-ann-mail\n")
        #expect(Self.secrets(f.secretTool(["search", "--all", "user", "carol"])).isEmpty)
        // A CLI item has the attributes service and account.
        expectSecret(Self.secrets(f.secretTool(["search", "--all", "service", "bench"])), equals: "s-cli\n")
        expectSecret(f.secretTool(["lookup", "service", "bench", "account", "acct-1"]).stdoutText, equals: "s-cli")
        // Deleted through the CLI: gone from the agent's next search; put again: back.
        #expect(f.cli(["rm", "bench", "acct-1"]).status == 0)
        #expect(Self.secrets(f.secretTool(["search", "--all", "service", "bench"])).isEmpty)
        #expect(f.secretTool(["lookup", "service", "bench", "account", "acct-1"]).status != 0)
        #expect(f.cli(["put", "bench", "acct-1"], stdin: "s-cli-2").status == 0)
        expectSecret(f.secretTool(["lookup", "service", "bench", "account", "acct-1"]).stdoutText, equals: "s-cli-2")
        // Each search is one audit entry (as a listing is), naming no attribute.
        // The D-Bus sender is recorded as its claimed requester; the queried values are not.
        let audit = f.cli(["audit", "--json"]).stdoutText
        let searches = audit.split(separator: "\n").filter { $0.contains("\"operation\":\"search\"") }
        #expect(!searches.isEmpty, "\(audit)")
        #expect(searches.allSatisfy { $0.contains("claimed requester /usr/bin/secret-tool") }, "\(searches)")
        #expect(!searches.contains { $0.contains("carol") || $0.contains("chat") }, "\(searches)")
    }

    @Test func anotherUsersItemsNeverComeBackEvenWithIdenticalAttributes() throws {
        let first = try SecretServiceFixture()
        store(first, ["service", "mail", "user", "ann"], "first-secret")
        let other = try TestUser(prefix: "khs")
        try first.broker.setPasswords([first.user.name: "right", other.name: "right"])
        let second = try SecretServiceFixture(broker: first.broker, user: other)
        store(second, ["service", "mail", "user", "ann"], "second-secret")
        // Root (this test process) stores the same map through the client library.
        let root = Vault(socketPath: first.broker.socketPath)
        let ref = try AttributeMapping.reference(for: ["service": "mail", "user": "ann"])
        try root.add(SecureBytes(copying: Array("root-secret".utf8)), service: ref.service, account: ref.account)

        expectSecret(Self.secrets(first.secretTool(["search", "--all", "user", "ann"])), equals: "first-secret\n")
        expectSecret(Self.secrets(second.secretTool(["search", "--all", "user", "ann"])), equals: "second-secret\n")
        expectSecret(first.secretTool(["lookup", "service", "mail", "user", "ann"]).stdoutText, equals: "first-secret")
        expectSecret(second.secretTool(["lookup", "service", "mail", "user", "ann"]).stdoutText, equals: "second-secret")
        let mine = try root.search(attributes: ["user": "ann"])
        #expect(mine.count == 1 && mine[0].service == ref.service && mine[0].account == ref.account)
        #expect(try root.search(attributes: [:]).count == 1)
    }

    @Test func anIndexEditedWhileTheBrokerIsDownNeverReturnsAWrongItem() throws {
        let f = try SecretServiceFixture()
        store(f, ["service", "mail", "user", "ann"], "ann-secret")
        store(f, ["service", "mail", "user", "bob"], "bob-secret")
        let other = try TestUser(prefix: "khs")
        try f.broker.setPasswords([f.user.name: "right", other.name: "right"])
        let second = try SecretServiceFixture(broker: f.broker, user: other)
        store(second, ["service", "mail", "user", "ann"], "foreign-secret")
        let ids = Self.listed(f)
        let annID = try #require(ids.first { $0.account.contains("user=ann") }?.id)
        let bobID = try #require(ids.first { $0.account.contains("user=bob") }?.id)
        let foreignID = try #require(Self.listed(second).first?.id)

        // Bob's rows all carry Ann's user=ann tag (the one they do not share); every one of Ann's tags also points at the other user's item.
        f.broker.stop()
        sql(f, """
            UPDATE item_search SET tag = (SELECT tag FROM item_search s WHERE s.item_id = x'\(annID)'
                    AND s.tag NOT IN (SELECT tag FROM item_search b WHERE b.item_id = x'\(bobID)'))
                WHERE item_id = x'\(bobID)';
            INSERT INTO item_search (item_id, tag) SELECT x'\(foreignID)', tag FROM item_search WHERE item_id = x'\(annID)';
            """)
        try f.broker.start()
        expectSecret(Self.secrets(f.secretTool(["search", "--all", "user", "ann"])), equals: "ann-secret\n")
        expectSecret(Self.secrets(f.secretTool(["search", "--all", "service", "mail"])), equals: "ann-secret\n")  // bob's rows moved: hidden
        expectSecret(Self.secrets(second.secretTool(["search", "--all", "user", "ann"])), equals: "foreign-secret\n")

        // Every row deleted: searches find nothing; `keyhold ls` and reads by name still work.
        f.broker.stop()
        sql(f, "DELETE FROM item_search;")
        try f.broker.start()
        #expect(Self.secrets(f.secretTool(["search", "--all", "user", "ann"])).isEmpty)
        let listed = f.cli(["ls"]).stdoutText
        #expect(listed.contains("user=ann") && listed.contains("user=bob"), "\(listed)")
        // The same names, read through the CLI: no secret lost.
        let annAccount = try #require(ids.first { $0.id == annID }?.account)
        let bobAccount = try #require(ids.first { $0.id == bobID }?.account)
        expectSecret(f.cli(["get", "mail", annAccount]).stdoutText, equals: "ann-secret")
        expectSecret(f.cli(["get", "mail", bobAccount]).stdoutText, equals: "bob-secret")
        // Storing an item again writes its rows.
        store(f, ["service", "mail", "user", "bob"], "bob-secret-2")
        expectSecret(Self.secrets(f.secretTool(["search", "--all", "user", "bob"])), equals: "bob-secret-2\n")
    }
}
