import Foundation
import Glibc
import Testing
import KeyholdTestSupport

/// A running prompt does not hold the agent: its authentication runs on its own thread, so
/// other clients are answered while it waits; a client that leaves mid-prompt leaves nothing
/// (its askpass is killed and the broker told the authentication was canceled).
/// Ordering is forced by an askpass that waits for the test's go-ahead (bounded), never by time.
@Suite(.serialized) struct SecretServicePromptTests {
    /// A gated item (`gate`/`ann`), an open one (`open`/`bob`), and an agent whose askpass
    /// marks that it started, waits for `askpass-go` (at most 60 s), marks that it answered.
    func fixture() throws -> SecretServiceFixture {
        let f = try SecretServiceFixture(startAgent: false)
        #expect(f.cli(["put", "gate", "ann", "--policy", "device-passcode", "--reuse", "120"], stdin: "gated-secret").status == 0)
        #expect(f.cli(["put", "open", "bob", "--policy", "none"], stdin: "open-secret").status == 0)
        let askpass = f.directory + "/slow-askpass"
        let body = """
            #!/bin/sh
            : > \(f.directory)/askpass-started
            i=0
            while [ ! -e \(f.directory)/askpass-go ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
            : > \(f.directory)/askpass-answered
            printf '%s\\n' 'right'

            """
        _ = FileManager.default.createFile(atPath: askpass, contents: Data(body.utf8))
        chmod(askpass, 0o755)
        try f.startAgent(environment: ["KEYHOLD_ASKPASS": askpass])
        return f
    }

    /// Client A: unlock the gated item (waits on the prompt), then read it; results in `out`.
    func startUnlockingClient(_ f: SecretServiceFixture, out: String) throws -> Process {
        let script = f.directory + "/unlock.py"
        _ = FileManager.default.createFile(atPath: script, contents: Data("""
            import secretstorage, sys
            c = secretstorage.get_default_collection(secretstorage.dbus_init())
            it = next(iter(c.search_items({"service": "gate", "account": "ann"})))
            dismissed = it.unlock()
            with open(sys.argv[1], "w") as out:
                out.write("dismissed %s\\n" % dismissed)
                out.write("secret %r\\n" % (it.get_secret(),))

            """.utf8))
        chmod(script, 0o644)
        return try f.spawn("/usr/bin/python3", [script, out], log: "unlock.log")
    }

    func exists(_ path: String) -> Bool { FileManager.default.fileExists(atPath: path) }

    /// Waits (bounded) for `path` to exist.
    func waitFor(_ path: String) -> Bool {
        for _ in 0..<3000 where !exists(path) { usleep(20_000) }
        return exists(path)
    }

    @Test func anotherClientIsAnsweredWhileAPromptWaits() throws {
        let f = try fixture()
        let out = f.directory + "/unlock.out"
        let a = try startUnlockingClient(f, out: out)
        defer { if a.isRunning { kill(a.processIdentifier, SIGKILL); a.waitUntilExit() } }
        #expect(waitFor(f.directory + "/askpass-started"), "the prompt did not reach the askpass: \(f.log("agent.log")) \(f.log("unlock.log"))")

        // While A's askpass waits for the go-ahead, B searches and reads an open item.
        let lookup = f.secretTool(["lookup", "service", "open", "account", "bob"])
        #expect(lookup.status == 0, "\(lookup.stderr)")
        expectSecret(lookup.stdoutText, equals: "open-secret")
        let search = f.python("""
            import secretstorage
            c = secretstorage.get_default_collection(secretstorage.dbus_init())
            print(sorted(i.get_secret() for i in c.search_items({"service": "open"})))
            """)
        let foundOpen = search.stdoutText.contains("[b'open-secret']")
        #expect(foundOpen, "\(search.stdout.count) bytes of output, \(search.stderr)")
        // B was answered before A's prompt got its answer.
        #expect(!exists(f.directory + "/askpass-answered"))
        #expect(!exists(out) && a.isRunning)

        _ = FileManager.default.createFile(atPath: f.directory + "/askpass-go", contents: nil)
        #expect(a.waitForExit(seconds: 120), "the unlocking client did not finish")
        let result = (try? String(contentsOfFile: out, encoding: .utf8)) ?? ""
        let found = [result.contains("dismissed False"), result.contains("secret b'gated-secret'")]
        #expect(found.allSatisfy { $0 }, "\(found), \(result.utf8.count) bytes of output, \(f.log("unlock.log"))")
    }

    @Test func aClientThatLeavesMidPromptLeavesNothingBehind() throws {
        let f = try fixture()
        let a = try startUnlockingClient(f, out: f.directory + "/unlock.out")
        #expect(waitFor(f.directory + "/askpass-started"), "\(f.log("agent.log"))")
        kill(a.processIdentifier, SIGKILL)
        a.waitUntilExit()

        // The agent keeps serving. It kills the abandoned prompt's askpass, and the broker
        // records the authentication as canceled (waited for, bounded): no grant.
        expectSecret(f.secretTool(["lookup", "service", "open", "account", "bob"]).stdoutText, equals: "open-secret")
        var audit = ""
        for _ in 0..<1500 where !audit.contains("user-canceled") {
            audit = f.cli(["audit", "--json", "--item", "gate/ann"]).stdoutText
            if !audit.contains("user-canceled") { usleep(20_000) }
        }
        #expect(audit.contains("user-canceled"), "\(audit) \(f.log("agent.log"))")
        #expect(!audit.split(separator: "\n").contains { $0.contains("\"operation\":\"get\"") && $0.contains("\"decision\":\"granted\"") },
                "\(audit)")
        // The askpass was killed before that entry: a go-ahead now is answered by no one.
        _ = FileManager.default.createFile(atPath: f.directory + "/askpass-go", contents: nil)
        usleep(300_000)
        #expect(!exists(f.directory + "/askpass-answered"))
        let probe = f.python("""
            import secretstorage
            c = secretstorage.get_default_collection(secretstorage.dbus_init())
            it = next(iter(c.search_items({"service": "gate", "account": "ann"})))
            print("locked", it.is_locked())
            """)
        #expect(probe.stdoutText.contains("locked True"), "\(probe.stdoutText) \(probe.stderr)")
        expectSecret(f.secretTool(["lookup", "service", "open", "account", "bob"]).stdoutText, equals: "open-secret")
    }

    /// A fingerprint prompt whose client leaves while the broker waits for a finger (no
    /// question is asked then, so no askpass runs to be killed): the agent tells the broker,
    /// which ends the wait at once, *user canceled*, and the reader is free again. (Left to
    /// pam_fprintd's own 10 s timeout, it would end as a failed scan instead.)
    @Test func aClientThatLeavesDuringAFingerWaitEndsIt() throws {
        try withFprintEnvironment { fp in
            let user = try TestUser(prefix: "khf")
            try fp.enroll(user: user.name, print: "print-user")
            let broker = try BrokerFixture(passwords: [user.name: "right"], environment: ["DBUS_SYSTEM_BUS_ADDRESS": fp.busAddress],
                                           fprintStateDirectory: fp.stateDirectory)
            let f = try SecretServiceFixture(broker: broker, user: user)
            #expect(f.cli(["put", "finger", "ann", "--policy", "biometry-any"], stdin: "finger-secret").status == 0)
            let script = f.directory + "/unlock-finger.py"
            _ = FileManager.default.createFile(atPath: script, contents: Data("""
                import secretstorage
                c = secretstorage.get_default_collection(secretstorage.dbus_init())
                it = next(iter(c.search_items({"service": "finger", "account": "ann"})))
                it.unlock()

                """.utf8))
            chmod(script, 0o644)
            let a = try f.spawn("/usr/bin/python3", [script], log: "unlock-finger.log")
            defer { if a.isRunning { kill(a.processIdentifier, SIGKILL); a.waitUntilExit() } }
            #expect(fp.waitUntilFingerNeeded(timeout: 30), "no finger wait: \(f.log("agent.log")) \(f.log("unlock-finger.log"))")
            kill(a.processIdentifier, SIGKILL)
            a.waitUntilExit()

            // Waited for, up to 30 s (pam_fprintd gives up after 10 s, with another outcome).
            var audit = ""
            let deadline = Date().addingTimeInterval(30)
            while !audit.contains("user-canceled"), Date() < deadline {
                audit = f.cli(["audit", "--json", "--item", "finger/ann"]).stdoutText
                if !audit.contains("user-canceled") { usleep(50_000) }
            }
            #expect(audit.contains("user-canceled"), "\(audit) \(f.log("agent.log"))")
            #expect(!audit.split(separator: "\n").contains { $0.contains("\"operation\":\"get\"") && $0.contains("\"decision\":\"granted\"") },
                    "\(audit)")
            var released = false
            for _ in 0..<100 where !released {
                released = !fp.waitUntilFingerNeeded(timeout: 0.05)
                usleep(50_000)
            }
            #expect(released, "fprintd still waits for a finger")
        }
    }

    /// Running prompts are bounded per client (2): a third Prompt() while two run is
    /// LimitsExceeded. The second stays running because it queues behind the first (the broker
    /// authenticates one request per uid at a time and answers others *busy*; a prompt waits
    /// that out for as long as an askpass may take, so no load can end it early). After the
    /// askpass answers, the first completes unlocked and the second with it (the reuse grant).
    @Test func runningPromptsAreCappedPerClient() throws {
        let f = try fixture()
        let script = f.directory + "/cap.py"
        _ = FileManager.default.createFile(atPath: script, contents: Data("""
            import secretstorage, sys
            from jeepney import DBusAddress, new_method_call, MatchRule, MessageType
            from jeepney.low_level import HeaderFields
            conn = secretstorage.dbus_init()
            c = secretstorage.get_default_collection(conn)
            it = next(iter(c.search_items({"service": "gate", "account": "ann"})))
            svc = DBusAddress("/org/freedesktop/secrets", "org.freedesktop.secrets", "org.freedesktop.Secret.Service")
            prompts = [conn.send_and_get_reply(new_method_call(svc, "Unlock", "ao", ([it.item_path],))).body[1] for _ in range(3)]
            rule = MatchRule(interface="org.freedesktop.Secret.Prompt", member="Completed", type=MessageType.signal)
            with conn.filter(rule, bufsize=10) as signals:
                for p in prompts:
                    # jeepney hands back an error reply as a message (it raises only when unwrapping).
                    reply = conn.send_and_get_reply(new_method_call(DBusAddress(p, "org.freedesktop.secrets", "org.freedesktop.Secret.Prompt"), "Prompt", "s", ("",)))
                    if reply.header.message_type == MessageType.error:
                        print("refused", reply.header.fields[HeaderFields.error_name], flush=True)
                    else:
                        print("started", flush=True)
                open(sys.argv[1], "w").close()
                for _ in range(2):
                    print("completed", conn.recv_until_filtered(signals, timeout=120).body[0], flush=True)

            """.utf8))
        chmod(script, 0o644)
        let marker = f.directory + "/cap-asked"
        let r = try f.spawn("/bin/sh", ["-c", "exec /usr/bin/python3 \(script) \(marker) > \(f.directory)/cap.out"], log: "cap.log")
        defer { if r.isRunning { kill(r.processIdentifier, SIGKILL); r.waitUntilExit() } }
        #expect(waitFor(marker), "\(f.log("cap.log")) \(f.log("agent.log"))")
        _ = FileManager.default.createFile(atPath: f.directory + "/askpass-go", contents: nil)
        #expect(r.waitForExit(seconds: 150))
        let out = f.log("cap.out")
        #expect(out.components(separatedBy: "started").count - 1 == 2, "\(out) \(f.log("cap.log"))")
        #expect(out.contains("refused org.freedesktop.DBus.Error.LimitsExceeded"), "\(out)")
        #expect(out.components(separatedBy: "completed ").count - 1 == 2, "\(out)")
        #expect(out.components(separatedBy: "completed False").count - 1 == 2, "\(out)")
    }
}
