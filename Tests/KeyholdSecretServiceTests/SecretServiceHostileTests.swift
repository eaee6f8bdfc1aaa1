import Foundation
import Glibc
import Testing
import KeyholdTestSupport

/// Bad D-Bus input gets the right error and the agent keeps serving (jeepney, the library
/// under python secretstorage, sends raw calls).
@Suite(.serialized) struct SecretServiceHostileTests {
    static let script = """
        import os, secretstorage
        from jeepney import DBusAddress, new_method_call
        from jeepney.wrappers import DBusErrorResponse
        from jeepney.io.blocking import open_dbus_connection
        conn = secretstorage.dbus_init()
        SVC = "org.freedesktop.secrets"
        def call(path, iface, member, sig="", args=()):
            try:
                reply = conn.send_and_get_reply(new_method_call(DBusAddress(path, SVC, iface), member, sig, args))
                if reply.header.message_type.name == "error":
                    return "error " + reply.header.fields[4]
                return "ok"
            except DBusErrorResponse as e:
                return "error " + e.name
        S = "/org/freedesktop/secrets"
        C = S + "/collection/login"
        print("unknown-method", call(S, "org.freedesktop.Secret.Service", "Frobnicate"))
        print("unknown-interface", call(S, "org.example.Nope", "OpenSession", "sv", ("plain", ("s", ""))))
        print("wrong-signature", call(S, "org.freedesktop.Secret.Service", "OpenSession", "s", ("plain",)))
        print("bad-algorithm", call(S, "org.freedesktop.Secret.Service", "OpenSession", "sv", ("rot13", ("s", ""))))
        print("bad-dh-key", call(S, "org.freedesktop.Secret.Service", "OpenSession", "sv",
                                 ("dh-ietf1024-sha256-aes128-cbc-pkcs7", ("ay", b"\\x01"))))
        print("unknown-object", call(S + "/collection/nope", "org.freedesktop.Secret.Collection", "SearchItems", "a{ss}", ({},)))
        print("bad-item-path", call(C + "/zz", "org.freedesktop.Secret.Item", "Delete"))
        print("missing-item", call(C + "/" + "0" * 32, "org.freedesktop.Secret.Item", "Delete"))
        print("set-alias", call(S, "org.freedesktop.Secret.Service", "SetAlias", "so", ("other", C)))
        print("huge-attributes", call(S, "org.freedesktop.Secret.Service", "SearchItems", "a{ss}",
                                      ({"k%d" % i: "v" for i in range(100)},)))
        print("huge-attribute", call(S, "org.freedesktop.Secret.Service", "SearchItems", "a{ss}", ({"k": "v" * 5000},)))
        # A plain session, then a secret above the cap.
        out = conn.send_and_get_reply(new_method_call(DBusAddress(S, SVC, "org.freedesktop.Secret.Service"),
                                      "OpenSession", "sv", ("plain", ("s", "")))).body
        session = out[1]
        props = {"org.freedesktop.Secret.Item.Label": ("s", "big"), "org.freedesktop.Secret.Item.Attributes": ("a{ss}", {"a": "b"})}
        print("huge-secret", call(C, "org.freedesktop.Secret.Collection", "CreateItem", "a{sv}(oayays)b",
                                  (props, (session, b"", b"x" * 100000, "text/plain"), True)))
        print("foreign-session", call(C, "org.freedesktop.Secret.Collection", "CreateItem", "a{sv}(oayays)b",
                                      (props, (S + "/session/999999", b"", b"x", "text/plain"), True)))
        # A thousand sessions from one client: refused past the per-client cap.
        results = [call(S, "org.freedesktop.Secret.Service", "OpenSession", "sv", ("plain", ("s", ""))) for _ in range(1000)]
        print("sessions-ok", results.count("ok"), "refused", sum(1 for r in results if r != "ok"), sorted(set(results))[-1])
        """

    /// A same-user client probing made-up item paths (well-formed ids) gets NoSuchObject for
    /// each and costs the broker at most one listing a second (`Agent.relistAfterMilliseconds`),
    /// not one per probe; a path learned elsewhere (`keyhold ls --json`) is found once the
    /// agent's listing is that old.
    @Test func probingMadeUpItemPathsListsTheItemsAtMostOnceASecond() throws {
        let f = try SecretServiceFixture()
        func lists() -> Int {
            f.cli(["audit", "--json"]).stdoutText.split(separator: "\n").filter { $0.contains("\"operation\":\"list\"") }.count
        }
        let before = lists()
        let probe = f.python("""
            import os, time, secretstorage
            from jeepney import DBusAddress, new_method_call
            conn = secretstorage.dbus_init()
            C = "/org/freedesktop/secrets/collection/login/"
            def label(path):
                m = new_method_call(DBusAddress(path, "org.freedesktop.secrets", "org.freedesktop.DBus.Properties"),
                                    "Get", "ss", ("org.freedesktop.Secret.Item", "Label"))
                reply = conn.send_and_get_reply(m)
                return reply.header.fields[4] if reply.header.message_type.name == "error" else "ok"
            start = time.monotonic()
            answers = [label(C + os.urandom(16).hex()) for _ in range(300)]
            print("nosuch", answers.count("org.freedesktop.Secret.Error.NoSuchObject"), "seconds", time.monotonic() - start)
            """)
        let words = probe.stdoutText.split(separator: " ")
        #expect(words.count == 4 && words[1] == "300", "\(probe.stdoutText) \(probe.stderr)")
        let seconds = words.count == 4 ? Double(words[3].trimmingCharacters(in: .whitespacesAndNewlines)) ?? 0 : 0
        let listed = lists() - before
        #expect(listed >= 1 && listed <= Int(seconds) + 2, "\(listed) listings for 300 probes in \(seconds) s")

        // An item put through the CLI, its path taken from `ls --json`: found once the listing is old.
        #expect(f.cli(["put", "probe", "real"], stdin: "v").status == 0)
        let id = try #require(f.cli(["ls", "--json"]).stdoutText.split(separator: "\n").compactMap { line -> String? in
            guard let d = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any] else { return nil }
            return d["service"] as? String == "probe" ? d["id"] as? String : nil
        }.first)
        usleep(1_100_000)  // Agent.relistAfterMilliseconds, and a margin
        let found = f.python("""
            import secretstorage
            from jeepney import DBusAddress, new_method_call
            conn = secretstorage.dbus_init()
            m = new_method_call(DBusAddress("/org/freedesktop/secrets/collection/login/\(id)", "org.freedesktop.secrets",
                                "org.freedesktop.DBus.Properties"), "Get", "ss", ("org.freedesktop.Secret.Item", "Label"))
            reply = conn.send_and_get_reply(m)
            print("error" if reply.header.message_type.name == "error" else "found")
            """)
        #expect(found.stdoutText.hasPrefix("found"), "\(found.stdoutText) \(found.stderr)")
    }

    @Test func badInputGetsTheRightErrorAndTheAgentKeepsServing() throws {
        let f = try SecretServiceFixture()
        let r = f.python(Self.script)
        #expect(r.status == 0, "\(r.stderr) \(f.log("agent.log"))")
        let lines = Dictionary(r.stdoutText.split(separator: "\n").compactMap { l -> (String, String)? in
            let parts = l.split(separator: " ", maxSplits: 1)
            return parts.count == 2 ? (String(parts[0]), String(parts[1])) : nil
        }, uniquingKeysWith: { a, _ in a })
        #expect(lines["unknown-method"] == "error org.freedesktop.DBus.Error.UnknownMethod", "\(r.stdoutText)")
        #expect(lines["unknown-interface"]?.hasPrefix("error org.freedesktop.DBus.Error.UnknownMethod") == true)
        #expect(lines["wrong-signature"] == "error org.freedesktop.DBus.Error.InvalidArgs")
        #expect(lines["bad-algorithm"] == "error org.freedesktop.DBus.Error.NotSupported")
        #expect(lines["bad-dh-key"] == "error org.freedesktop.DBus.Error.InvalidArgs")
        #expect(lines["unknown-object"]?.hasPrefix("error org.freedesktop.DBus.Error.UnknownObject") == true)
        #expect(lines["bad-item-path"]?.hasPrefix("error org.freedesktop.DBus.Error.UnknownObject") == true)
        #expect(lines["missing-item"] == "error org.freedesktop.Secret.Error.NoSuchObject")
        #expect(lines["set-alias"] == "error org.freedesktop.DBus.Error.NotSupported")
        #expect(lines["huge-attributes"] == "error org.freedesktop.DBus.Error.LimitsExceeded")
        #expect(lines["huge-attribute"] == "error org.freedesktop.DBus.Error.LimitsExceeded")
        #expect(lines["huge-secret"] == "error org.freedesktop.DBus.Error.LimitsExceeded")
        #expect(lines["foreign-session"] == "error org.freedesktop.Secret.Error.NoSession")
        #expect(lines["sessions-ok"]?.hasPrefix("63 refused 937") == true, "\(lines["sessions-ok"] ?? "")")

        // The client is gone: its sessions went with it, and the agent still serves.
        #expect(f.agent?.isRunning == true)
        #expect(f.secretTool(["store", "--label=x", "service", "after", "account", "a"], stdin: "still").status == 0)
        expectSecret(f.secretTool(["lookup", "service", "after", "account", "a"]).stdoutText, equals: "still")
        let again = f.python("""
            import secretstorage
            from jeepney import DBusAddress, new_method_call
            conn = secretstorage.dbus_init()
            n = 0
            for _ in range(64):
                m = new_method_call(DBusAddress("/org/freedesktop/secrets", "org.freedesktop.secrets",
                                    "org.freedesktop.Secret.Service"), "OpenSession", "sv", ("plain", ("s", "")))
                if conn.send_and_get_reply(m).header.message_type.name != "error": n += 1
            print("fresh-client-sessions", n)
            """)
        #expect(again.stdoutText.contains("fresh-client-sessions 64"), "\(again.stdoutText) \(again.stderr)")
    }
}
