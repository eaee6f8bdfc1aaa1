import Foundation
import Glibc
import Testing
import KeyholdTestSupport

/// Only the owner's processes, each for itself (issue 35, item 1), attacked as the issue's
/// repros do: another uid let onto the bus by a permissive policy, a process that forks after
/// connecting and lets the connecting process exit, and calls sent just before the sender
/// leaves the bus. Each is refused, nothing is listed, changed or deleted, and each refusal
/// is in the owner's audit log.
@Suite(.serialized) struct SecretServiceCallerTests {
    /// Raw calls through jeepney (under python secretstorage): `call` prints the D-Bus error
    /// name, or "ok" and what the reply lists.
    static let prelude = """
        import os, sys, time
        from jeepney import DBusAddress, new_method_call
        from jeepney.io.blocking import open_dbus_connection
        SVC = "org.freedesktop.secrets"
        S = "/org/freedesktop/secrets"
        C = S + "/collection/login"
        def call(conn, path, iface, member, sig="", args=()):
            reply = conn.send_and_get_reply(new_method_call(DBusAddress(path, SVC, iface), member, sig, args), timeout=30)
            if reply.header.message_type.name == "error":
                return "error " + reply.header.fields[4]
            return "ok " + repr(reply.body)
        def items(conn):
            return call(conn, C, "org.freedesktop.DBus.Properties", "Get", "ss", ("org.freedesktop.Secret.Collection", "Items"))
        def all_props(conn):
            return call(conn, C, "org.freedesktop.DBus.Properties", "GetAll", "s", ("org.freedesktop.Secret.Collection",))
        def session(conn):
            return call(conn, S, "org.freedesktop.Secret.Service", "OpenSession", "sv", ("plain", ("s", "")))
        def replace(conn, session_path):
            props = {"org.freedesktop.Secret.Item.Label": ("s", "evil"),
                     "org.freedesktop.Secret.Item.Attributes": ("a{ss}", {"service": "caller", "account": "ann"})}
            return new_method_call(DBusAddress(C, SVC, "org.freedesktop.Secret.Collection"), "CreateItem", "a{sv}(oayays)b",
                                   (props, (session_path, b"", b"attacker", "text/plain"), True))

        """

    /// The owner's item and its path.
    static func storeItem(_ f: SecretServiceFixture) throws -> String {
        let stored = f.secretTool(["store", "--label=x", "service", "caller", "account", "ann"], stdin: "mine")
        #expect(stored.status == 0, "\(f.log("agent.log"))")
        let id = try #require(f.cli(["ls", "--json"]).stdoutText.split(separator: "\n").compactMap { line -> String? in
            guard let d = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any] else { return nil }
            return d["account"] as? String == "ann" ? d["id"] as? String : nil
        }.first)
        return "/org/freedesktop/secrets/collection/login/" + id
    }

    /// Denied audit rows whose reason holds every one of `needles`, waited for: the agent reports
    /// its refusals from another thread.
    static func deniedRows(_ f: SecretServiceFixture, _ needles: [String]) -> [Substring] {
        var rows: [Substring] = []
        for _ in 0..<100 {
            rows = f.cli(["audit", "--json"]).stdoutText.split(separator: "\n")
                .filter { row in row.contains("\"decision\":\"denied\"") && needles.allSatisfy { row.contains($0) } }
            if !rows.isEmpty { break }
            usleep(100_000)
        }
        return rows
    }

    static func expectIntact(_ f: SecretServiceFixture) {
        expectSecret(f.secretTool(["lookup", "service", "caller", "account", "ann"]).stdoutText, equals: "mine")
        let audit = f.cli(["audit", "--json"]).stdoutText.split(separator: "\n")
        #expect(!audit.contains { ($0.contains("\"operation\":\"delete\"") || $0.contains("\"operation\":\"update\""))
                    && $0.contains("\"decision\":\"granted\"") }, "\(audit)")
    }

    @Test func anotherUserOnAPermissiveBusListsNothingAndChangesNothing() throws {
        let guest = try TestUser(prefix: "khg")
        let f = try SecretServiceFixture(busGuests: [guest.name])
        let path = try Self.storeItem(f)
        let script = f.directory + "/guest.py"
        _ = FileManager.default.createFile(atPath: script, contents: Data((Self.prelude + """
            conn = open_dbus_connection(bus="SESSION")
            P = sys.argv[1]
            print("items", items(conn))
            print("getall", all_props(conn))
            print("search", call(conn, S, "org.freedesktop.Secret.Service", "SearchItems", "a{ss}", ({"service": "caller"},)))
            print("label", call(conn, P, "org.freedesktop.DBus.Properties", "Get", "ss", ("org.freedesktop.Secret.Item", "Label")))
            print("session", session(conn))
            print("getsecrets", call(conn, S, "org.freedesktop.Secret.Service", "GetSecrets", "aoo", ([P], S + "/session/1")))
            print("introspect", call(conn, C, "org.freedesktop.DBus.Introspectable", "Introspect"))
            print("delete", call(conn, P, "org.freedesktop.Secret.Item", "Delete"))
            reply = conn.send_and_get_reply(replace(conn, S + "/session/1"), timeout=30)
            print("create", reply.header.message_type.name, reply.header.fields.get(4))
            """).utf8))
        chmod(script, 0o644)
        let env = f.userEnvironment().map { "\($0)=\($1)" }
        let r = runCommand("/usr/bin/env", ["-i"] + env + ["timeout", "-s", "KILL", "60", "/usr/bin/python3", script, path], asUser: guest.name)
        let lines = r.stdoutText.split(separator: "\n")
        #expect(lines.count == 9, "\(r.stdoutText) \(r.stderr)")
        for line in lines {
            #expect(line.contains("org.freedesktop.DBus.Error.AccessDenied"), "\(line)")
            #expect(!line.contains(path.split(separator: "/").last!) && !line.contains("ann") && !line.contains("mine"), "\(line)")
        }
        Self.expectIntact(f)
        // The refusals are the owner's audit entries: the broker refused each report (the
        // guest's pid runs as another uid, or is gone already after the last call), naming the
        // call and the uid the bus gave for it.
        let why = "(uid \(guest.uid))"
        for asked in ["Get on /org/freedesktop/secrets/collection/login from", "GetAll on", "SearchItems on", "Delete on \(path)",
                      "CreateItem on", "OpenSession on", "GetSecrets on", "Introspect on"] {
            #expect(!Self.deniedRows(f, [why, "refused by the Secret Service agent: \(asked)"]).isEmpty,
                    "no audited refusal of \(asked): \(f.cli(["audit", "--json"]).stdoutText)")
        }
        // The item is named in the refusals of calls made on it.
        #expect(Self.deniedRows(f, [why, "Delete on"]).allSatisfy { $0.contains("\"account\":\"ann\"") })
        // The owner still lists it.
        let listed = f.secretTool(["search", "--all", "service", "caller"])
        #expect((listed.stdoutText + listed.stderr).contains("ann"), "\(listed.stdoutText) \(listed.stderr)")
    }

    /// The issue's repro: connect, fork, let the connecting process exit, then use the
    /// inherited connection. The bus still names the connecting pid; it is gone, so every call
    /// is refused, the calls made before the fork (by the live process) having worked.
    @Test func aForkedChildOfAConnectionWhoseConnectingProcessExitedIsRefused() throws {
        let f = try SecretServiceFixture()
        let path = try Self.storeItem(f)
        let script = f.directory + "/fork.py"
        _ = FileManager.default.createFile(atPath: script, contents: Data((Self.prelude + """
            P = sys.argv[1]
            go_r, go_w = os.pipe()
            out_r, out_w = os.pipe()
            connecting = os.fork()
            if connecting == 0:
                conn = open_dbus_connection(bus="SESSION")
                before = items(conn)
                sess = session(conn)
                child = os.fork()
                if child == 0:
                    os.read(go_r, 1)  # until the connecting process is gone and reaped
                    lines = ["before " + before, "items " + items(conn), "getall " + all_props(conn),
                             "secret " + call(conn, P, "org.freedesktop.Secret.Item", "GetSecret", "o", (S + "/session/1",)),
                             "search " + call(conn, S, "org.freedesktop.Secret.Service", "SearchItems", "a{ss}", ({"service": "caller"},)),
                             "delete " + call(conn, P, "org.freedesktop.Secret.Item", "Delete")]
                    reply = conn.send_and_get_reply(replace(conn, S + "/session/1"), timeout=30)
                    lines.append("create " + reply.header.message_type.name + " " + str(reply.header.fields.get(4)))
                    os.write(out_w, ("\\n".join(lines) + "\\n").encode())
                    os._exit(0)
                os._exit(0)
            os.waitpid(connecting, 0)
            os.write(go_w, b"x")
            os.close(out_w)
            data = b""
            while True:
                chunk = os.read(out_r, 65536)
                if not chunk:
                    break
                data += chunk
            sys.stdout.write(data.decode())
            """).utf8))
        chmod(script, 0o644)
        let r = f.run("/usr/bin/python3", [script, path])
        let lines = r.stdoutText.split(separator: "\n")
        #expect(lines.count == 7, "\(r.stdoutText) \(r.stderr)")
        // While the connecting process lived, the connection was served.
        #expect(lines.first?.hasPrefix("before ok") == true && lines.first?.contains(path) == true, "\(r.stdoutText)")
        for line in lines.dropFirst() {
            #expect(line.contains("org.freedesktop.DBus.Error.AccessDenied") && !line.contains("mine"), "\(line)")
        }
        Self.expectIntact(f)
        for asked in ["Get on", "GetAll on", "GetSecret on \(path)", "SearchItems on", "Delete on \(path)", "CreateItem on"] {
            #expect(!Self.deniedRows(f, ["via the Secret Service is gone", "refused by the Secret Service agent: \(asked)"]).isEmpty,
                    "no audited refusal of \(asked): \(f.cli(["audit", "--json"]).stdoutText)")
        }
    }

    /// `Delete` and a replacing `CreateItem` sent by another user's process that leaves the bus
    /// without waiting for the answer: the agent finds the sender gone or foreign and refuses;
    /// nothing is deleted or replaced, and the refusals are audited (under the uid when the bus
    /// could still say it, else as a sender whose credentials could not be read).
    @Test func callsSentJustBeforeLeavingTheBusAreRefused() throws {
        let guest = try TestUser(prefix: "khg")
        let f = try SecretServiceFixture(busGuests: [guest.name])
        let path = try Self.storeItem(f)
        let script = f.directory + "/leave.py"
        _ = FileManager.default.createFile(atPath: script, contents: Data((Self.prelude + """
            for _ in range(5):
                conn = open_dbus_connection(bus="SESSION")
                conn.send(new_method_call(DBusAddress(sys.argv[1], SVC, "org.freedesktop.Secret.Item"), "Delete"))
                conn.send(replace(conn, S + "/session/1"))
                conn.close()
            """).utf8))
        chmod(script, 0o644)
        let env = f.userEnvironment().map { "\($0)=\($1)" }
        let r = runCommand("/usr/bin/env", ["-i"] + env + ["timeout", "-s", "KILL", "60", "/usr/bin/python3", script, path], asUser: guest.name)
        #expect(r.status == 0, "\(r.stderr)")
        // The agent still serves the owner, and has dealt with every call sent before that.
        Self.expectIntact(f)
        let refusedDeletes = Self.deniedRows(f, ["refused by the Secret Service agent: Delete on \(path)"])
        let refusedCreates = Self.deniedRows(f, ["refused by the Secret Service agent: CreateItem on"])
        #expect(!refusedDeletes.isEmpty && !refusedCreates.isEmpty, "\(f.cli(["audit", "--json"]).stdoutText)")
        for row in refusedDeletes + refusedCreates {
            #expect(row.contains("runs as uid \(guest.uid)") || row.contains("could not read the sender's credentials")
                    || row.contains("is gone"), "\(row)")
        }
    }

    /// The agent's change signals go to the user's own clients only: another uid subscribed to
    /// every signal on a permissive bus hears nothing of an item being relabelled (its path or
    /// its new label), while the owner's own listener does.
    @Test func anotherUserOnAPermissiveBusHearsNoSignals() throws {
        let guest = try TestUser(prefix: "khg")
        let f = try SecretServiceFixture(busGuests: [guest.name])
        let path = try Self.storeItem(f)
        let ready = f.directory + "/guest-ready", heard = f.directory + "/guest-heard"
        for file in [ready, heard] {
            _ = FileManager.default.createFile(atPath: file, contents: nil)
            chown(file, guest.uid, gid_t(guest.uid))
        }
        let script = f.directory + "/listen.py"
        _ = FileManager.default.createFile(atPath: script, contents: Data((Self.prelude + """
            from jeepney import MatchRule, message_bus
            from jeepney.bus_messages import message_bus as bus_methods
            conn = open_dbus_connection(bus="SESSION")
            conn.send_and_get_reply(bus_methods.AddMatch(MatchRule(type="signal")), timeout=30)
            with open(sys.argv[1], "w") as f:
                f.write("ready")
            heard = []
            while True:
                msg = conn.receive(timeout=60)
                member = msg.header.fields.get(3)
                if member == "Probe":
                    break
                if msg.header.fields.get(2, "").startswith("org.freedesktop.Secret") or "Secret" in repr(msg.body) or "relabelled" in repr(msg.body):
                    heard.append(member)
            with open(sys.argv[2], "w") as f:
                f.write("heard %d %s" % (len(heard), sorted(set(heard))))
            """).utf8))
        chmod(script, 0o644)
        let listener = Process()
        listener.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
        listener.arguments = ["--reuid=\(guest.name)", "--regid=\(guest.name)", "--init-groups", "--", "/usr/bin/python3", script, ready, heard]
        listener.environment = f.userEnvironment()
        listener.standardOutput = FileHandle.nullDevice
        try listener.run()
        defer { if listener.isRunning { kill(listener.processIdentifier, SIGKILL); listener.waitUntilExit() } }
        var isReady = false
        for _ in 0..<300 where !isReady {
            isReady = f.log("guest-ready") == "ready"
            if !isReady { usleep(20_000) }
        }
        #expect(isReady)
        // The owner listens too (a client that has called), relabels, reads the label back (so
        // every signal of the change was sent before that answer), and then sends the probe.
        let owner = f.python(Self.prelude + """
            from jeepney import MatchRule
            from jeepney.bus_messages import message_bus as bus_methods
            import subprocess
            listener = open_dbus_connection(bus="SESSION")
            listener.send_and_get_reply(bus_methods.AddMatch(MatchRule(type="signal", interface="org.freedesktop.DBus.Properties")), timeout=30)
            call(listener, S, "org.freedesktop.DBus.Properties", "Get", "ss", ("org.freedesktop.Secret.Service", "Collections"))
            conn = open_dbus_connection(bus="SESSION")
            P = sys.argv[1]
            print("set", call(conn, P, "org.freedesktop.DBus.Properties", "Set", "ssv", ("org.freedesktop.Secret.Item", "Label", ("s", "relabelled")))[:2])
            print("get", call(conn, P, "org.freedesktop.DBus.Properties", "Get", "ss", ("org.freedesktop.Secret.Item", "Label")))
            while True:
                msg = listener.receive(timeout=30)
                if msg.header.fields.get(3) == "PropertiesChanged" and "relabelled" in repr(msg.body):
                    print("owner-heard relabelled")
                    break
            subprocess.run(["/usr/bin/dbus-send", "--session", "--type=signal", "/probe", "org.keyhold.Probe.Probe"], check=True)
            """, arguments: [path])
        #expect(owner.stdoutText.contains("owner-heard relabelled"), "\(owner.stdoutText) \(owner.stderr) \(f.log("agent.log"))")
        #expect(listener.waitForExit(seconds: 60))
        #expect(f.log("guest-heard") == "heard 0 []", "\(f.log("guest-heard"))")
    }

    /// A flood of refused calls from another uid cannot spend the owner's audit budget: the
    /// first 64 are reported one by one, then one a second, saying how many it stands for; the
    /// owner is served as before.
    @Test func aFloodOfRefusedCallsIsReportedBounded() throws {
        let guest = try TestUser(prefix: "khg")
        let f = try SecretServiceFixture(busGuests: [guest.name])
        _ = try Self.storeItem(f)
        let script = f.directory + "/flood.py"
        _ = FileManager.default.createFile(atPath: script, contents: Data((Self.prelude + """
            conn = open_dbus_connection(bus="SESSION")
            # 100: the bus itself allows 128 calls awaiting a reply per connection.
            for n in range(100):
                conn.send(new_method_call(DBusAddress(C, SVC, "org.freedesktop.DBus.Properties"), "Get", "ss",
                                          ("org.freedesktop.Secret.Collection", "Items")))
            print("last", items(conn))
            time.sleep(2.5)  # the reports' rate is one a second: the next one is due
            print("later", items(conn))
            """).utf8))
        chmod(script, 0o644)
        let env = f.userEnvironment().map { "\($0)=\($1)" }
        let r = runCommand("/usr/bin/env", ["-i"] + env + ["timeout", "-s", "KILL", "60", "/usr/bin/python3", script], asUser: guest.name)
        #expect(r.stdoutText == "last error org.freedesktop.DBus.Error.AccessDenied\nlater error org.freedesktop.DBus.Error.AccessDenied\n",
                "\(r.stdoutText) \(r.stderr)")
        let summary = Self.deniedRows(f, ["more refused call(s) from uid \(guest.uid) not reported one by one"])
        #expect(summary.count == 1, "\(summary)")
        let reported = f.cli(["audit", "--json"]).stdoutText.split(separator: "\n").filter { $0.contains("refused by the Secret Service agent") }
        #expect(reported.count >= 64 && reported.count <= 68, "\(reported.count) refusals reported")
        Self.expectIntact(f)
    }
}
