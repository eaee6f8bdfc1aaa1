import Foundation
import Glibc
import Testing
import KeyholdTestSupport

/// Change signals seen by a real subscriber (dbus-monitor on the private bus): ItemCreated,
/// ItemChanged, ItemDeleted, the service's CollectionChanged and Properties.PropertiesChanged
/// on the collection (Items) and on the item (Label).
@Suite(.serialized) struct SecretServiceSignalTests {
    /// dbus-monitor as the test user, its output in `signals.log`; returns once it sees a probe.
    func startMonitor(_ f: SecretServiceFixture) throws -> Process {
        let out = f.directory + "/signals.log"
        let monitor = try f.spawn("/bin/sh", ["-c", "exec /usr/bin/dbus-monitor --address \"$DBUS_SESSION_BUS_ADDRESS\" \"type='signal'\" > \(out)"],
                                  log: "monitor.log")
        for _ in 0..<300 {
            f.run("/usr/bin/dbus-send", ["--session", "--type=signal", "/probe", "org.keyhold.Probe.Ping"])
            if f.log("signals.log").contains("member=Ping") { break }
            usleep(20_000)
        }
        return monitor
    }

    /// Waits (bounded) until the monitor's output contains `text`.
    func waitFor(_ f: SecretServiceFixture, _ text: String) -> Bool {
        for _ in 0..<500 {
            if f.log("signals.log").contains(text) { return true }
            usleep(20_000)
        }
        return false
    }

    @Test func changesAreSignalled() throws {
        let f = try SecretServiceFixture()
        let monitor = try startMonitor(f)
        defer { kill(monitor.processIdentifier, SIGKILL); monitor.waitUntilExit() }
        #expect(f.log("signals.log").contains("member=Ping"), "the monitor did not start: \(f.log("monitor.log"))")

        #expect(f.secretTool(["store", "--label=one", "service", "sig", "account", "ann"], stdin: "v1").status == 0)
        #expect(waitFor(f, "member=ItemCreated"), "\(f.log("signals.log"))")
        let signals = f.log("signals.log")
        #expect(signals.contains("path=/org/freedesktop/secrets; interface=org.freedesktop.Secret.Service; member=CollectionChanged"), "\(signals)")
        #expect(signals.contains("path=/org/freedesktop/secrets/collection/login; interface=org.freedesktop.DBus.Properties; member=PropertiesChanged"), "\(signals)")
        #expect(signals.contains("string \"Items\""), "\(signals)")

        let relabel = f.python("""
            import secretstorage
            conn = secretstorage.dbus_init()
            coll = secretstorage.get_default_collection(conn)
            it = next(coll.search_items({"service": "sig", "account": "ann"}))
            it.set_label("two")
            print(it.item_path)
            """)
        #expect(relabel.status == 0, "\(relabel.stderr)")
        let itemPath = relabel.stdoutText.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(waitFor(f, "path=\(itemPath); interface=org.freedesktop.DBus.Properties; member=PropertiesChanged"), "\(f.log("signals.log"))")
        #expect(waitFor(f, "member=ItemChanged"))
        let afterRelabel = f.log("signals.log")
        #expect(afterRelabel.contains("string \"org.freedesktop.Secret.Item\""), "\(afterRelabel)")
        #expect(afterRelabel.contains("string \"Label\""), "\(afterRelabel)")

        #expect(f.secretTool(["clear", "service", "sig", "account", "ann"]).status == 0)
        #expect(waitFor(f, "member=ItemDeleted"), "\(f.log("signals.log"))")
    }

    /// A python prelude: subscribes (AddMatch) to the agent's signals; `wait_for` reads a
    /// filter (open it with a large bufsize: jeepney drops what a full queue cannot take).
    static let listener = """
        import secretstorage, sys
        from jeepney import MatchRule, MessageType
        from jeepney.bus_messages import message_bus
        from jeepney.io.blocking import Proxy
        conn = secretstorage.dbus_init()
        rule = MatchRule(type=MessageType.signal, sender="org.freedesktop.secrets")
        Proxy(message_bus, conn).AddMatch(rule)
        coll = secretstorage.get_default_collection(conn)
        def wait_for(signals, what, limit=200):
            # Bounded: at most `limit` signals, each awaited for at most 60 s.
            for _ in range(limit):
                m = conn.recv_until_filtered(signals, timeout=60)
                if what(m):
                    return m
            return None

        """

    @Test func propertiesChangedCarriesTheValues() throws {
        let f = try SecretServiceFixture()
        #expect(f.secretTool(["store", "--label=one", "service", "val", "account", "ann"], stdin: "v1").status == 0)
        let r = f.python(Self.listener + """
            it = next(coll.search_items({"service": "val", "account": "ann"}))
            rule = MatchRule(type=MessageType.signal, interface="org.freedesktop.DBus.Properties", member="PropertiesChanged", path=it.item_path)
            with conn.filter(rule, bufsize=100) as signals:
                it.set_label("two")
                m = wait_for(signals, lambda m: m.body[0] == "org.freedesktop.Secret.Item")
                print("item", m.body[0], sorted(m.body[1].items()), m.body[2])
            # Signals name the collection by its own path (secretstorage holds the alias's).
            login = "/org/freedesktop/secrets/collection/login"
            rule = MatchRule(type=MessageType.signal, interface="org.freedesktop.DBus.Properties", member="PropertiesChanged", path=login)
            with conn.filter(rule, bufsize=100) as signals:
                coll.create_item("three", {"service": "val", "account": "bob"}, b"v3")
                m = wait_for(signals, lambda m: "Items" in m.body[1])
                paths = m.body[1]["Items"][1]
                print("items", len(paths), all(p.startswith(login + "/") for p in paths))
            """)
        #expect(r.status == 0, "\(r.stderr) \(f.log("agent.log"))")
        // The new label and the broker's modification time, as values (nothing invalidated).
        #expect(r.stdoutText.contains("item org.freedesktop.Secret.Item [('Label', ('s', 'two')), ('Modified', ('t', "), "\(r.stdoutText)")
        #expect(r.stdoutText.contains(")] []"), "\(r.stdoutText)")
        #expect(r.stdoutText.contains("items 2 True"), "\(r.stdoutText)")
    }

    /// When an unlocked item's reuse window ends, a listener is told: Locked = true on the item
    /// and ItemChanged on the collection (waited for, bounded; no upper time asserted).
    @Test func theEndOfAReuseWindowIsSignalled() throws {
        let f = try SecretServiceFixture(startAgent: false)
        #expect(f.cli(["put", "lapse", "ann", "--policy", "device-passcode", "--reuse", "3"], stdin: "gated").status == 0)
        try f.startAgent(environment: ["KEYHOLD_ASKPASS": f.broker.askpass(answering: "right", name: "ap-lapse")])
        let r = f.python(Self.listener + """
            it = next(coll.search_items({"service": "lapse"}))
            locked = MatchRule(type=MessageType.signal, interface="org.freedesktop.DBus.Properties", member="PropertiesChanged", path=it.item_path)
            changed = MatchRule(type=MessageType.signal, interface="org.freedesktop.Secret.Collection", member="ItemChanged")
            with conn.filter(locked, bufsize=100) as props, conn.filter(changed, bufsize=100) as items:
                print("dismissed", it.unlock())
                m = wait_for(props, lambda m: m.body[1].get("Locked") == ("b", True))
                print("relocked", m is not None and m.body[1]["Locked"])
                # One ItemChanged for the unlock, one for the lapse.
                m = wait_for(items, lambda m: m.body[0] == it.item_path)
                m = m and wait_for(items, lambda m: m.body[0] == it.item_path)
                print("item-changed", m is not None)
            print("locked-now", it.is_locked())
            """)
        #expect(r.status == 0, "\(r.stderr) \(f.log("agent.log"))")
        #expect(r.stdoutText.contains("dismissed False"), "\(r.stdoutText)")
        #expect(r.stdoutText.contains("relocked ('b', True)"), "\(r.stdoutText)")
        #expect(r.stdoutText.contains("item-changed True"), "\(r.stdoutText)")
        #expect(r.stdoutText.contains("locked-now True"), "\(r.stdoutText)")
    }
}
