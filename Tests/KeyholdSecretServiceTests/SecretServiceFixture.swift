import Foundation
import Glibc
import KeyholdTestSupport

/// A private session bus and the Secret Service agent, both run as a throwaway user (the agent
/// refuses root), in front of a real root broker. Clients (secret-tool, python) run as that
/// user on that bus. Never the machine's bus: the address is a socket in a temp directory.
final class SecretServiceFixture: @unchecked Sendable {
    let broker: BrokerFixture
    let user: TestUser
    let directory: String
    let busAddress: String
    let servicesDirectory: String
    private var bus: Process?
    private(set) var agent: Process?

    static let agentPath = TestPaths.products + "/keyhold-secret-service"
    static let dbusDaemon = "/usr/bin/dbus-daemon"

    init(broker: BrokerFixture? = nil, user: TestUser? = nil, password: String = "right", startAgent: Bool = true,
         agentArguments: [String] = [], agentEnvironment: [String: String] = [:], busGuests: [String] = []) throws {
        let user = try user ?? TestUser(prefix: "khs")
        self.user = user
        self.broker = try broker ?? BrokerFixture(passwords: [user.name: password])
        directory = TestPaths.temporaryDirectory("khss")
        chown(directory, user.uid, gid_t(user.uid))
        chmod(directory, busGuests.isEmpty ? 0o700 : 0o711)  // guests reach the bus socket only
        servicesDirectory = directory + "/services"
        mkdir(servicesDirectory, 0o755)
        chown(servicesDirectory, user.uid, gid_t(user.uid))
        busAddress = "unix:path=\(directory)/bus"
        let config = """
            <!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
             "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
            <busconfig>
              <type>session</type>
              <listen>\(busAddress)</listen>
              <servicedir>\(servicesDirectory)</servicedir>
              <policy context="default">
            \(busGuests.map { "    <allow user=\"\($0)\"/>\n    <allow receive_sender=\"*\"/>" }.joined(separator: "\n"))
                <allow send_destination="*" eavesdrop="true"/>
                <allow eavesdrop="true"/>
                <allow own="*"/>
              </policy>
            </busconfig>
            """
        try config.write(toFile: directory + "/bus.conf", atomically: true, encoding: .utf8)
        chmod(directory + "/bus.conf", 0o644)
        bus = try spawn(Self.dbusDaemon, ["--config-file=\(directory)/bus.conf", "--nofork", "--nopidfile"], log: "bus.log")
        for _ in 0..<500 where !FileManager.default.fileExists(atPath: directory + "/bus") { usleep(10_000) }
        if startAgent { try self.startAgent(agentArguments, environment: agentEnvironment) }
    }

    /// Starts a process as the test user on this bus, its stderr in `log`.
    func spawn(_ path: String, _ arguments: [String], environment: [String: String] = [:], log: String) throws -> Process {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
        p.arguments = ["--reuid=\(user.name)", "--regid=\(user.name)", "--init-groups", "--", path] + arguments
        p.environment = userEnvironment(environment)
        let logPath = directory + "/" + log
        _ = FileManager.default.createFile(atPath: logPath, contents: nil)
        chown(logPath, user.uid, gid_t(user.uid))
        p.standardError = FileHandle(forWritingAtPath: logPath)
        p.standardOutput = FileHandle.nullDevice
        p.standardInput = FileHandle.nullDevice
        try p.run()
        return p
    }

    func userEnvironment(_ extra: [String: String] = [:]) -> [String: String] {
        var env = ["PATH": "/usr/bin:/bin", "HOME": directory, "DBUS_SESSION_BUS_ADDRESS": busAddress, "LANG": "C.UTF-8",
                   "XDG_RUNTIME_DIR": directory, "SWIFT_BACKTRACE": "enable=no"]
        for (k, v) in extra { env[k] = v }
        return env
    }

    func startAgent(_ arguments: [String] = [], environment: [String: String] = [:]) throws {
        agent = try spawnAgent(arguments, environment: environment)
        guard waitForName() else { throw FixtureError.brokerDidNotStart("the agent did not own the name: \(log("agent.log"))") }
    }

    func spawnAgent(_ arguments: [String] = [], environment: [String: String] = [:], log: String = "agent.log") throws -> Process {
        try spawn(Self.agentPath, ["--socket", broker.socketPath] + arguments, environment: environment, log: log)
    }

    func log(_ name: String) -> String { (try? String(contentsOfFile: directory + "/" + name, encoding: .utf8)) ?? "" }

    /// Whether org.freedesktop.secrets has an owner on this bus (bounded wait for `true`).
    func waitForName(_ owned: Bool = true, attempts: Int = 300) -> Bool {
        for _ in 0..<attempts {
            let r = run("/usr/bin/dbus-send", ["--session", "--print-reply", "--dest=org.freedesktop.DBus", "/org/freedesktop/DBus",
                                               "org.freedesktop.DBus.NameHasOwner", "string:org.freedesktop.secrets"])
            if r.stdoutText.contains("boolean \(owned)") { return true }
            usleep(20_000)
        }
        return false
    }

    /// Runs a client as the test user on this bus.
    @discardableResult
    func run(_ path: String, _ arguments: [String], stdin: [UInt8] = [], environment: [String: String] = [:]) -> CommandResult {
        runCommand("/usr/bin/env", ["-i"] + userEnvironment(environment).map { "\($0)=\($1)" } + ["timeout", "-s", "KILL", "60", path] + arguments,
                   stdin: stdin, asUser: user.name)
    }

    func secretTool(_ arguments: [String], stdin: String = "") -> CommandResult {
        run("/usr/bin/secret-tool", arguments, stdin: Array(stdin.utf8))
    }

    /// Runs a python script (python3-secretstorage / python3-keyring from Debian).
    func python(_ script: String, arguments: [String] = [], environment: [String: String] = [:]) -> CommandResult {
        let path = directory + "/script-\(UInt32.random(in: 0...UInt32.max)).py"
        _ = FileManager.default.createFile(atPath: path, contents: Data(script.utf8))
        chmod(path, 0o644)
        return run("/usr/bin/python3", [path] + arguments, environment: environment)
    }

    /// The CLI as the test user against this broker.
    func cli(_ arguments: [String], stdin: String = "", environment: [String: String] = [:]) -> CommandResult {
        broker.cli(arguments, stdin: Array(stdin.utf8), environment: environment, asUser: user.name)
    }

    /// The bus goes away under the agent.
    func killBus() {
        guard let b = bus, b.isRunning else { return }
        kill(b.processIdentifier, SIGKILL)
        b.waitUntilExit()
    }

    func stopAgent() {
        guard let a = agent, a.isRunning else { return }
        a.terminate()
        a.waitUntilExit()
    }

    deinit {
        if let a = agent, a.isRunning { a.terminate(); a.waitUntilExit() }
        // SIGKILL: the test process may have SIGTERM blocked, and the bus inherits that mask.
        if let b = bus, b.isRunning { kill(b.processIdentifier, SIGKILL); b.waitUntilExit() }
        try? FileManager.default.removeItem(atPath: directory)
    }
}

extension Process {
    /// Waits up to `seconds` for the process to end; true if it did.
    func waitForExit(seconds: Double) -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while isRunning && Date() < deadline { usleep(20_000) }
        return !isRunning
    }
}
