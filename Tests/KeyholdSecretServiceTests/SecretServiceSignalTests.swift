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
}
