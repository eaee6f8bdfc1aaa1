import Foundation
import Glibc
import Testing
import KeyholdTestSupport

/// A reused pid against an `--allow-exe` item (SECURITY.md, "PID reuse"): the connector sends
/// its request and exits before the broker accepts; the process it handed the connection to
/// forks until a child gets the connector's pid, and that child execs the allowed program,
/// holding the connection alone. The sender's pid (`SCM_CREDENTIALS`) and the connector's
/// (`SO_PEERCRED`) then both name the allowed program, the only holder of the connection; only
/// the connector's own pidfd (`SO_PEERPIDFD`, which keeps naming the exited process) tells that
/// the process that connected is gone.
extension HostileLocalUserTests {
    @Test func aConnectorWhosePIDTheAllowedProgramTakesIsRefused() throws {
        let (entry, b) = try pidTakenByTheAllowedProgram(mode: "pidreuse", reason: "pidreuse") { b in
            #expect(b.brokerLog.contains("callers: each connection names its process (SO_PEERPIDFD)"), "\(b.brokerLog)")
        }
        #expect(entry?["outcome"] as? String == "not-authorized", "\(String(describing: entry))")
        // Nor is the allowed program named as the sender: the connector's pidfd says it exited,
        // so its executable is unknown.
        #expect(entry?["executable"] as? String == "?", "\(String(describing: entry))")
        #expect(!auditEntries(b).contains { ($0["reason"] as? String) == "pidreuse" && ($0["outcome"] as? String) == "ok" })
    }

    /// The same race against a sender that is not the connector: a child of the connector sends
    /// the request on its connection and exits, and another process gets its pid and runs the
    /// allowed program. The request is refused in any case (its sender did not connect); what
    /// is tested is that its entry does not name the program that took the pid: the kernel
    /// hands the broker a pidfd of each message's sender (`SO_PASSPIDFD`), which keeps naming
    /// the exited child, where a `pidfd_open` of the number would open the newcomer.
    @Test func aSenderWhosePIDAnotherProgramTakesIsNotNamedAsThatProgram() throws {
        let (entry, b) = try pidTakenByTheAllowedProgram(mode: "pidreusesender", reason: "pidreuse-sender") { _ in }
        #expect(entry?["outcome"] as? String == "not-authorized", "\(String(describing: entry))")
        #expect(entry?["executable"] as? String == "?", "the exited sender, not the program that took its pid: \(String(describing: entry))")
        #expect(!auditEntries(b).contains { ($0["reason"] as? String) == "pidreuse-sender" && ($0["outcome"] as? String) == "ok" })
    }

    /// With the broker stopped, `hostile_client.py MODE` has a request for an `--allow-exe`
    /// item sent (with `reason`) and the allowed program take the sender's pid; then the broker
    /// goes on. The request's audit entry (nil if none came), and the broker.
    private func pidTakenByTheAllowedProgram(mode: String, reason: String,
                                             checkBroker: (BrokerFixture) -> Void) throws -> ([String: Any]?, BrokerFixture) {
        let user = try TestUser(prefix: "khp")
        let b = try BrokerFixture()
        #expect(b.cli(["put", "allowed", "x", "--allow-exe", Self.sleepExe], stdin: Array("reuse-secret".utf8), asUser: user.name).status == 0)
        let broker = try #require(b.process?.processIdentifier)
        checkBroker(b)
        // Stopped, the broker accepts and reads nothing: the request waits in the socket's queue
        // until the allowed program runs under the sender's pid.
        kill(broker, SIGSTOP)
        var stopped = true
        defer { if stopped { kill(broker, SIGCONT) } }
        // As root: only root can point the pid allocator (ns_last_pid); the sender and the
        // allowed program run as the user. An unprivileged attacker forks round the pid space
        // instead (32,768 pids here), which only takes longer.
        let r = runCommand("/usr/bin/python3", [Self.client, mode, b.socketPath, Self.sleepExe, "allowed", "x", "\(user.uid)"])
        let json = (try? JSONSerialization.jsonObject(with: Data(r.stdout))) as? [String: Any] ?? [:]
        let sender = try #require((json["sender"] as? Int).map(Int32.init), "\(r.stdoutText) \(r.stderr)")
        try #require(json["spawned"] as? Int == Int(sender), "the allowed program got the sender's pid: \(json)")
        try #require(Self.waitForExecutable(pid: sender, Self.sleepExe), "pid \(sender) runs \(Self.sleepExe): \(json), \(r.stderr)")
        defer { kill(sender, SIGKILL) }  // the allowed program, as checked just above

        kill(broker, SIGCONT)
        stopped = false
        // Its entry (a sender given up for a new one, whose pid another process took, was
        // queued too: refused as well, its connection having no holder).
        var entry: [String: Any]?
        for _ in 0..<500 where entry == nil {
            entry = auditEntries(b).first { ($0["reason"] as? String) == reason && ($0["pid"] as? Int) == Int(sender) }
            if entry == nil { usleep(20_000) }
        }
        return (entry, b)
    }

    static func waitForExecutable(pid: Int32, _ exe: String, seconds: Int = 5) -> Bool {
        for _ in 0..<(seconds * 100) {
            if (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/exe")) == exe { return true }
            usleep(10_000)
        }
        return false
    }
}
