import Foundation
import Glibc
import Testing
import KeyholdTestSupport

/// Start, refusal, replacement, SIGTERM, bus loss, D-Bus activation with the shipped file.
@Suite(.serialized) struct SecretServiceLifecycleTests {
    @Test func refusesAnOwnedNameUnlessReplaceThenTheOldAgentLeaves() throws {
        let f = try SecretServiceFixture()
        let second = try f.spawnAgent(log: "second.log")
        #expect(second.waitForExit(seconds: 30))
        #expect(second.terminationStatus == 1)
        #expect(f.log("second.log").contains("already owned"), "\(f.log("second.log"))")

        let replacing = try f.spawnAgent(["--replace"], log: "replacing.log")
        #expect(f.agent?.waitForExit(seconds: 30) == true, "the replaced agent exits")
        #expect(f.agent?.terminationStatus == 0)
        #expect(replacing.isRunning)
        #expect(f.secretTool(["store", "--label=x", "service", "s", "account", "a"], stdin: "v").status == 0)
        expectSecret(f.secretTool(["lookup", "service", "s", "account", "a"]).stdoutText, equals: "v")
        replacing.terminate()
        #expect(replacing.waitForExit(seconds: 30) && replacing.terminationStatus == 0)
    }

    @Test func exitsCleanlyOnSIGTERMAndOnBusLoss() throws {
        let f = try SecretServiceFixture()
        f.agent?.terminate()
        #expect(f.agent?.waitForExit(seconds: 30) == true)
        #expect(f.agent?.terminationStatus == 0)

        try f.startAgent()
        f.killBus()
        #expect(f.agent?.waitForExit(seconds: 30) == true, "the agent leaves with its bus")
        #expect(f.agent?.terminationStatus == 0)
    }

    @Test func refusesRoot() throws {
        let r = runCommand(SecretServiceFixture.agentPath, [], environment: ["DBUS_SESSION_BUS_ADDRESS": "unix:path=/nonexistent"])
        #expect(r.status == 1 && r.stderr.contains("never as root"), "\(r.stderr)")
    }

    /// The shipped activation file, its Exec pointed at the built agent: the bus starts the
    /// agent on the first call, as a session bus would.
    @Test func busActivationWithTheShippedServiceFile() throws {
        let f = try SecretServiceFixture(startAgent: false)
        let shipped = try String(contentsOfFile: TestPaths.repository + "/dbus/org.freedesktop.secrets.service", encoding: .utf8)
        #expect(shipped.contains("Name=org.freedesktop.secrets"))
        #expect(shipped.contains("SystemdService=keyhold-secret-service.service"))
        let file = shipped.replacingOccurrences(of: "Exec=/usr/local/bin/keyhold-secret-service",
                                                with: "Exec=\(SecretServiceFixture.agentPath) --socket \(f.broker.socketPath)")
        #expect(file != shipped)
        try file.write(toFile: f.servicesDirectory + "/org.freedesktop.secrets.service", atomically: true, encoding: .utf8)
        chmod(f.servicesDirectory + "/org.freedesktop.secrets.service", 0o644)
        #expect(f.waitForName(false, attempts: 1))
        #expect(f.secretTool(["store", "--label=x", "service", "act", "account", "a"], stdin: "activated").status == 0)
        #expect(f.waitForName(true, attempts: 5))
        expectSecret(f.secretTool(["lookup", "service", "act", "account", "a"]).stdoutText, equals: "activated")
        let unit = try String(contentsOfFile: TestPaths.repository + "/systemd/keyhold-secret-service.service", encoding: .utf8)
        #expect(unit.contains("BusName=org.freedesktop.secrets") && unit.contains("ExecStart=/usr/local/bin/keyhold-secret-service"))
    }
}
