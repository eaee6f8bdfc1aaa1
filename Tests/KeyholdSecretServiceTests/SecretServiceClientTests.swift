import Foundation
import Glibc
import Testing
import KeyholdTestSupport

/// Real clients (libsecret's secret-tool, python secretstorage and keyring) against the real
/// agent on a private bus, in front of the real broker.
@Suite(.serialized) struct SecretServiceClientTests {
    @Test func secretToolStoreLookupSearchReplaceClear() throws {
        let f = try SecretServiceFixture()
        let store = f.secretTool(["store", "--label=Mail token", "service", "mail", "account", "ann"], stdin: "tok-1")
        #expect(store.status == 0, "\(store.stderr) \(f.log("agent.log"))")
        let lookup = f.secretTool(["lookup", "service", "mail", "account", "ann"])
        #expect(lookup.status == 0, "\(lookup.stderr)")
        expectSecret(lookup.stdoutText, equals: "tok-1")

        let search = f.secretTool(["search", "--all", "service", "mail"])
        #expect(search.status == 0, "\(search.stderr)")
        // The output holds the secret: searched outside #expect, so a failure prints none of it.
        let found = [search.stdoutText.contains("label = Mail token"), search.stdoutText.contains("secret = tok-1"),
                     (search.stdoutText + search.stderr).contains("attribute.account = ann")]  // secret-tool prints them on stderr
        #expect(found.allSatisfy { $0 }, "\(found)")

        // Replace: the same attributes name the same item.
        #expect(f.secretTool(["store", "--label=Mail token", "service", "mail", "account", "ann"], stdin: "tok-2").status == 0)
        expectSecret(f.secretTool(["lookup", "service", "mail", "account", "ann"]).stdoutText, equals: "tok-2")

        // Really in the vault, under the names `keyhold put mail ann` would use.
        let ls = f.cli(["ls"])
        #expect(ls.status == 0 && ls.stdoutText.contains("mail") && ls.stdoutText.contains("ann"), "\(ls.stderr)")
        #expect(ls.stdoutText.split(separator: "\n").count == 2, "one item: \(ls.stdoutText)")

        // Every read audited as a granted get, naming the claimed requester.
        let audit = f.cli(["audit", "--json", "--item", "mail/ann"])
        #expect(audit.stdoutText.contains("\"granted\""), "\(audit.stdoutText)")
        #expect(audit.stdoutText.contains("claimed requester /usr/bin/secret-tool"), "\(audit.stdoutText)")

        #expect(f.secretTool(["clear", "service", "mail", "account", "ann"]).status == 0)
        #expect(f.secretTool(["lookup", "service", "mail", "account", "ann"]).status != 0)
        #expect(f.cli(["ls"]).stdoutText.split(separator: "\n").count <= 1)
    }

    @Test func pythonSecretStorageOverDHAndKeyring() throws {
        let f = try SecretServiceFixture()
        let r = f.python("""
            import secretstorage, keyring
            from secretstorage.util import open_session
            conn = secretstorage.dbus_init()
            s = open_session(conn)
            print("encrypted", s.encrypted, s.aes_key is not None)
            coll = secretstorage.get_default_collection(conn)
            it = coll.create_item("py item", {"application": "myapp", "user": "me=you&x"}, b"s3cret\\x00bin",
                                  content_type="application/octet-stream")
            print("secret", it.get_secret(), it.get_secret_content_type())
            print("attributes", sorted(it.get_attributes().items()), it.get_label(), it.is_locked())
            found = list(coll.search_items({"user": "me=you&x"}))
            print("found", len(found), found[0].get_secret())
            it.set_label("renamed")
            print("relabelled", it.get_label(), it.get_secret(), it.get_secret_content_type())
            keyring.set_password("svc", "bob", "pw1")
            print("keyring", keyring.get_password("svc", "bob"))
            keyring.delete_password("svc", "bob")
            print("after delete", keyring.get_password("svc", "bob"))
            it.delete()
            print("left", len(list(coll.get_all_items())))
            """)
        #expect(r.status == 0, "\(r.stderr) \(f.log("agent.log"))")
        // The output holds the secrets: searched outside #expect, so a failure prints none of it.
        let out = r.stdoutText
        let found = [out.contains("encrypted True True"),
                     out.contains("secret b's3cret\\x00bin' application/octet-stream"),
                     out.contains("attributes [('application', 'myapp'), ('user', 'me=you&x')] py item False"),
                     out.contains("found 1 b's3cret\\x00bin'"),
                     out.contains("relabelled renamed b's3cret\\x00bin' application/octet-stream"),
                     out.contains("keyring pw1"),
                     out.contains("after delete None"),
                     out.contains("left 0")]
        #expect(found.allSatisfy { $0 }, "\(found), \(out.utf8.count) bytes of output")
    }

    @Test func cliItemsThroughTheSecretServiceAndBack() throws {
        let f = try SecretServiceFixture()
        #expect(f.cli(["put", "github.com", "ann"], stdin: "from-cli").status == 0)
        let lookup = f.secretTool(["lookup", "service", "github.com", "account", "ann"])
        #expect(lookup.status == 0, "\(lookup.stderr) \(f.log("agent.log"))")
        expectSecret(lookup.stdoutText, equals: "from-cli")

        #expect(f.secretTool(["store", "--label=x", "service", "gitlab.com", "account", "bob"], stdin: "from-dbus").status == 0)
        let get = f.cli(["get", "gitlab.com", "bob"])
        #expect(get.status == 0, "\(get.stderr)")
        expectSecret(get.stdoutText, equals: "from-dbus")
    }

    @Test func allowExeItemsAreNeverReleasedThroughTheAgent() throws {
        let f = try SecretServiceFixture()
        #expect(f.cli(["put", "pinned", "ann", "--allow-exe", "/usr/bin/secret-tool"], stdin: "pinned-secret").status == 0)
        let lookup = f.secretTool(["lookup", "service", "pinned", "account", "ann"])
        #expect(lookup.status != 0 && !lookup.stdoutText.contains("pinned-secret"))
        let audit = f.cli(["audit", "--json", "--item", "pinned/ann"])
        #expect(audit.stdoutText.contains("not-authorized"), "\(audit.stdoutText)")
    }

    @Test func aSecondUsersAgentSeesNoneOfTheFirstUsersItems() throws {
        let first = try SecretServiceFixture()
        #expect(first.secretTool(["store", "--label=x", "service", "mine", "account", "ann"], stdin: "first-secret").status == 0)
        let other = try TestUser(prefix: "khs")
        try first.broker.setPasswords([first.user.name: "right", other.name: "right"])
        let second = try SecretServiceFixture(broker: first.broker, user: other)
        #expect(second.secretTool(["lookup", "service", "mine", "account", "ann"]).status != 0)
        let search = second.secretTool(["search", "--all", "service", "mine"])
        #expect(!search.stdoutText.contains("first-secret"))
        #expect(second.python("""
            import secretstorage
            c = secretstorage.get_default_collection(secretstorage.dbus_init())
            print("count", len(list(c.get_all_items())))
            """).stdoutText.contains("count 0"))
        // The first user's item is still there for the first user.
        expectSecret(first.secretTool(["lookup", "service", "mine", "account", "ann"]).stdoutText, equals: "first-secret")
    }
}
