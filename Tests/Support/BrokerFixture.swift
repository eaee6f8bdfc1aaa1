import Foundation
import Glibc
import Synchronization

/// A real `keyholdd` on a temporary state directory and socket, using the test PAM stacks in
/// `pam/test` (pam_matrix with a temporary passdb, so no real account is touched).
public final class BrokerFixture: @unchecked Sendable {
    public let directory: String
    public let stateDirectory: String
    public let socketPath: String
    public let passdb: String
    public let pamDirectory: String
    public private(set) var process: Process?
    public var extraEnvironment: [String: String]
    /// More `keyholdd` options (`--free-space-reserve`, a key protector, a TPM's TCTI), after
    /// the fixture's own, at every start.
    public var extraArguments: [String]
    public let fprintStateDirectory: String?

    /// Passwords for pam_matrix: user → password.
    public init(passwords: [String: String] = ["root": "right-password"], environment: [String: String] = [:],
                fprintStateDirectory: String? = nil, pamDirectory: String? = nil, extraArguments: [String] = []) throws {
        ignoreBrokenPipes
        directory = TestPaths.temporaryDirectory("khb")
        chmod(directory, 0o755)  // an unprivileged test user must reach the socket
        stateDirectory = directory + "/state"
        socketPath = directory + "/k.sock"
        passdb = directory + "/passdb"
        self.pamDirectory = pamDirectory ?? PAMTestStacks.directory
        // Never the machine's /var/lib/fprint: an empty store unless a test brings fprintd's.
        let emptyPrints = directory + "/no-prints"
        if fprintStateDirectory == nil { mkdir(emptyPrints, 0o700) }
        self.fprintStateDirectory = fprintStateDirectory ?? emptyPrints
        extraEnvironment = environment
        self.extraArguments = extraArguments
        try setPasswords(passwords)
        try start()
    }

    /// pam_matrix's passdb: `user:password:service`; only the first line per user counts and
    /// the service field must match, so each user gets a line per Keyhold stack.
    public func setPasswords(_ passwords: [String: String]) throws {
        var text = ""
        for (user, pw) in passwords.sorted(by: { $0.key < $1.key }) {
            text += "\(user):\(pw):keyhold-passcode\n"
        }
        try text.write(toFile: passdb, atomically: true, encoding: .utf8)
        chmod(passdb, 0o600)
    }

    public func start() throws {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: TestPaths.keyholdd)
        startSyslog()
        var args = ["--state-dir", stateDirectory, "--socket", socketPath, "--pam-dir", pamDirectory,
                    "--syslog-socket", syslogPath]
        if let f = fprintStateDirectory { args += ["--fprint-state-dir", f] }
        // Test vaults never seal into (or take NV counters of) a real TPM the machine may have.
        if !extraArguments.contains("--key-protector") { args += ["--key-protector", "file"] }
        p.arguments = args + extraArguments
        var env = ProcessInfo.processInfo.environment
        env["PAM_MATRIX_PASSWD"] = passdb
        for (k, v) in extraEnvironment { env[k] = v }
        p.environment = env
        p.standardOutput = FileHandle.nullDevice
        let log = FileHandle(forWritingAtPath: directory + "/broker.log") ?? {
            _ = FileManager.default.createFile(atPath: directory + "/broker.log", contents: nil)
            return FileHandle(forWritingAtPath: directory + "/broker.log")!
        }()
        log.seekToEndOfFile()
        p.standardError = log
        try p.run()
        process = p
        // Ready when the socket accepts a connection (up to 30 s: a loaded CI machine may take
        // seconds to start a broker; a ready one returns at once).
        for _ in 0..<3000 {
            if canConnect() { return }
            if !p.isRunning { throw FixtureError.brokerExited(p.terminationStatus, brokerLog) }
            usleep(10_000)
        }
        // Still starting (SIGTERM is blocked until it serves): SIGKILL, so deinit cannot hang.
        kill9()
        throw FixtureError.brokerDidNotStart(brokerLog)
    }

    /// The broker's audit copies to the system log arrive here (a datagram socket of the test).
    public var syslogPath: String { directory + "/log.sock" }
    private var syslogFD: Int32 = -1
    private let syslogBox = LinesBox()
    public var syslogLines: [String] { syslogBox.lines }

    func startSyslog() {
        guard syslogFD < 0 else { return }
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue), 0)
        var addr = sockaddr_un()
        addr.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(syslogPath.utf8)
        withUnsafeMutableBytes(of: &addr.sun_path) { raw in raw.copyBytes(from: bytes); raw[bytes.count] = 0 }
        let len = socklen_t(MemoryLayout<sa_family_t>.size + bytes.count + 1)
        _ = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, len) } }
        syslogFD = fd
        let box = syslogBox
        let reader = Thread {
            var buf = [UInt8](repeating: 0, count: 65536)
            while true {
                let n = recv(fd, &buf, buf.count, 0)
                if n <= 0 { return }
                box.append(String(decoding: buf[0..<n], as: UTF8.self))
            }
        }
        reader.start()
    }

    public var brokerLog: String { (try? String(contentsOfFile: directory + "/broker.log", encoding: .utf8)) ?? "" }

    func canConnect() -> Bool { socketAccepts(socketPath) }

    /// SIGTERM and wait: a clean shutdown.
    public func stop() {
        guard let p = process, p.isRunning else { process = nil; return }
        p.terminate()
        p.waitUntilExit()
        process = nil
    }

    /// SIGKILL: no chance to clean up.
    public func kill9() {
        guard let p = process, p.isRunning else { return }
        kill(p.processIdentifier, SIGKILL)
        p.waitUntilExit()
        process = nil
    }

    public var pid: Int32 { process?.processIdentifier ?? -1 }

    /// Runs the `keyhold` CLI against this broker.
    @discardableResult
    public func cli(_ arguments: [String], stdin: [UInt8] = [], environment: [String: String] = [:], asUser: String? = nil) -> CommandResult {
        runCommand(TestPaths.keyhold, ["--socket", socketPath] + arguments, stdin: stdin, environment: environment, asUser: asUser)
    }

    /// An askpass program that answers every prompt with `answer` (or exits 1: cancel).
    public func askpass(answering answer: String?, name: String = "askpass") -> String {
        let path = directory + "/" + name
        let body = answer.map { "#!/bin/sh\nprintf '%s\\n' '\($0)'\n" } ?? "#!/bin/sh\nexit 1\n"
        _ = FileManager.default.createFile(atPath: path, contents: Data(body.utf8))
        chmod(path, 0o755)
        return path
    }

    deinit {
        stop()
        if syslogFD >= 0 { shutdown(syslogFD, Int32(SHUT_RDWR)); close(syslogFD) }
        try? FileManager.default.removeItem(atPath: directory)
    }
}

public enum FixtureError: Error, CustomStringConvertible {
    case brokerExited(Int32, String)
    case brokerDidNotStart(String)
    public var description: String {
        switch self {
        case .brokerExited(let s, let log): "keyholdd exited with \(s): \(log)"
        case .brokerDidNotStart(let log): "keyholdd did not start: \(log)"
        }
    }
}

extension BrokerFixture {
    /// An askpass program that answers PAM prompts with `password` and the item's application
    /// password prompt with `appPassword`; nil for either means "cancel" at that prompt.
    public func askpass(password: String?, appPassword: String?, name: String) -> String {
        func answer(_ v: String?) -> String { v.map { "printf '%s\\n' '\($0)'; exit 0" } ?? "exit 1" }
        let path = directory + "/" + name
        let body = """
            #!/bin/sh
            case "$1" in
              *"Application password"*|*"Again"*) \(answer(appPassword)) ;;
              *) \(answer(password)) ;;
            esac

            """
        _ = FileManager.default.createFile(atPath: path, contents: Data(body.utf8))
        chmod(path, 0o755)
        return path
    }

    /// Runs a shell script in ONE new session with no terminal (several `keyhold` calls that
    /// share a login session, as reuse windows need). `$KH` is the CLI with this broker's socket.
    @discardableResult
    public func script(_ body: String, environment: [String: String] = [:], asUser: String? = nil) -> CommandResult {
        var env = environment
        env["KH_BIN"] = TestPaths.keyhold
        env["KH_SOCK"] = socketPath
        let text = "KH() { \"$KH_BIN\" --socket \"$KH_SOCK\" \"$@\"; }\n" + body
        return runCommand("/bin/sh", ["-c", text], environment: env, asUser: asUser)
    }

    /// A PAM directory copied from `pam/test`, with a marker module first in every auth stack:
    /// pam_exec touches `marker` whenever PAM runs the stack at all.
    public func pamDirectoryWithMarker(_ marker: String) throws -> String {
        try pamDirectory(prependingToAuth: "auth optional pam_exec.so quiet /usr/bin/touch \(marker)")
    }

    /// A PAM directory copied from `pam/test` whose auth stacks first log the PAM items pam_exec
    /// exports (PAM_USER, PAM_RUSER, PAM_TTY, PAM_RHOST, …) to `log`.
    public func pamDirectoryLoggingItems(to log: String) throws -> String {
        try pamDirectory(prependingToAuth: "auth optional pam_exec.so quiet log=\(log) /usr/bin/env")
    }

    /// A PAM directory copied from `pam/test` whose auth stacks first sleep `seconds`: a PAM
    /// helper slow to reach its first prompt, as a real fingerprint module can be.
    public func pamDirectoryDelayingPrompts(seconds: Int) throws -> String {
        try pamDirectory(prependingToAuth: "auth optional pam_exec.so quiet /bin/sleep \(seconds)")
    }

    func pamDirectory(prependingToAuth line: String) throws -> String {
        let dir = directory + "/pam-\(abs(line.hashValue) % 100000)"
        try? FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        for name in try FileManager.default.contentsOfDirectory(atPath: pamDirectory) {
            var text = try String(contentsOfFile: pamDirectory + "/" + name, encoding: .utf8)
            if name.hasPrefix("keyhold") { text = line + "\n" + text }
            try text.write(toFile: dir + "/" + name, atomically: true, encoding: .utf8)
        }
        return dir
    }
}
