import Foundation
import Glibc
import Testing
import KeyholdTestSupport

/// The pid the agent passes is a claim the broker checks: a D-Bus client running as another
/// user (let onto the bus by its policy) names a process that is not the caller's, and the
/// broker refuses the request (a search as much as a read) rather than act on it.
@Suite(.serialized) struct SecretServiceClaimTests {
    @Test func claimedPIDOfAnotherUserIsRefused() throws {
        let guest = try TestUser(prefix: "khg")
        let f = try SecretServiceFixture(busGuests: [guest.name])
        #expect(f.secretTool(["store", "--label=x", "service", "claim", "account", "ann"], stdin: "mine").status == 0,
                "\(f.log("agent.log"))")

        let env = f.userEnvironment().map { "\($0)=\($1)" }
        func asGuest(_ command: [String]) -> CommandResult {
            runCommand("/usr/bin/env", ["-i"] + env + ["timeout", "-s", "KILL", "60"] + command, asUser: guest.name)
        }
        // A search on the guest's behalf is refused: the guest learns no item, not even its path.
        let search = asGuest(["/usr/bin/secret-tool", "search", "--all", "service", "claim"])
        #expect(!search.stdoutText.contains("mine") && !search.stdoutText.contains("ann"), "\(search.stdout.count) bytes of output")
        let lookup = asGuest(["/usr/bin/secret-tool", "lookup", "service", "claim", "account", "ann"])
        #expect(lookup.status != 0 && !lookup.stdoutText.contains("mine"), "guest read: \(lookup.stdout.count) bytes, \(lookup.stderr)")
        // A guest that knows the item's path anyway (ids are not secret) asks for its secret directly.
        let id = try #require(f.cli(["ls", "--json"]).stdoutText.split(separator: "\n").compactMap { line -> String? in
            guard let d = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any] else { return nil }
            return d["account"] as? String == "ann" ? d["id"] as? String : nil
        }.first)
        let script = f.directory + "/guest-get.py"
        _ = FileManager.default.createFile(atPath: script, contents: Data("""
            import sys
            from jeepney import DBusAddress, new_method_call, MessageType
            from jeepney.io.blocking import open_dbus_connection
            conn = open_dbus_connection(bus="SESSION")
            svc = DBusAddress("/org/freedesktop/secrets", "org.freedesktop.secrets", "org.freedesktop.Secret.Service")
            opened = conn.send_and_get_reply(new_method_call(svc, "OpenSession", "sv", ("plain", ("s", ""))))
            # Refused too: the read is then tried with a made-up session path.
            refused = opened.header.message_type == MessageType.error
            session = "/org/freedesktop/secrets/session/1" if refused else opened.body[1]
            item = DBusAddress(sys.argv[1], "org.freedesktop.secrets", "org.freedesktop.Secret.Item")
            reply = conn.send_and_get_reply(new_method_call(item, "GetSecret", "o", (session,)))
            print("error" if reply.header.message_type == MessageType.error else "released", reply.body)
            """.utf8))
        chmod(script, 0o644)
        let direct = asGuest(["/usr/bin/python3", script, "/org/freedesktop/secrets/collection/login/" + id])
        #expect(direct.stdoutText.hasPrefix("error") && !direct.stdoutText.contains("mine"), "\(direct.stdout.count) bytes of output, \(direct.stderr)")

        let audit = f.cli(["audit", "--json"])
        let rows = audit.stdoutText.split(separator: "\n")
        #expect(!rows.contains { $0.contains("\"operation\":\"get\"") && $0.contains("\"decision\":\"granted\"") }, "\(audit.stdoutText)")
        // The agent refuses another uid's calls itself (SecretServiceCallerTests), and has the
        // broker record each: with why (the claimed pid is another uid's) and the call asked.
        // A call on an item names it; a search names none.
        let why = "runs as uid \(guest.uid), not as the caller"
        #expect(rows.contains { $0.contains("\"operation\":\"search\"") && $0.contains("\"decision\":\"denied\"") && $0.contains(why) },
                "\(audit.stdoutText)")
        #expect(rows.contains { $0.contains("\"operation\":\"state\"") && $0.contains("\"account\":\"ann\"") && $0.contains("\"decision\":\"denied\"")
                    && $0.contains("\"outcome\":\"not-authorized\"") && $0.contains("claimed requester (pid ") && $0.contains(why)
                    && $0.contains("GetSecret on") },
                "\(audit.stdoutText)")
        #expect(!rows.contains { $0.contains("\"operation\":\"invalid\"") }, "\(audit.stdoutText)")
        // The owner still reads it.
        expectSecret(f.secretTool(["lookup", "service", "claim", "account", "ann"]).stdoutText, equals: "mine")
    }
}
