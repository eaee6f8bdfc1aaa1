import Foundation
import Glibc
import Synchronization

/// A test that writes to a child's stdin or a socket the broker already closed (a busy
/// answer, a frame deadline) must see EPIPE, not kill the whole test process with SIGPIPE.
/// Runs once, from every fixture and command helper.
public let ignoreBrokenPipes: Void = { signal(SIGPIPE, SIG_IGN); return () }()

/// Where the built products and the repository are, seen from a test process.
public enum TestPaths {
    /// The directory holding `keyholdd` and `keyhold` (next to the test bundle).
    public static let products: String = {
        ignoreBrokenPipes
        let exe = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
        var dir = URL(fileURLWithPath: exe).deletingLastPathComponent()
        // swift-testing may run the bundle from inside <name>.xctest/…
        while !FileManager.default.fileExists(atPath: dir.appendingPathComponent("keyholdd").path), dir.path != "/" {
            dir = dir.deletingLastPathComponent()
        }
        return dir.path
    }()

    public static var keyholdd: String { products + "/keyholdd" }
    /// The PAM helper keyholdd starts for each transaction (it looks beside itself).
    public static var pamHelper: String { products + "/keyhold-pam-helper" }
    /// The CLI is linked statically, so no test target may depend on it (SwiftPM would link its
    /// flags into the test bundle); `swift build --build-tests` builds it beside `keyholdd`.
    public static var keyhold: String {
        let path = products + "/keyhold"
        precondition(access(path, X_OK) == 0, "\(path) is not built: run `swift build --build-tests` first")
        return path
    }

    /// The repository root (for `pam/test` and `schema.sql`).
    public static let repository: String = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent().path

    /// A fresh, short temporary directory (Unix socket paths must stay under 108 bytes),
    /// removed when the test process exits if the test did not remove it itself (a release
    /// gate's PAM stack or a socket's directory is used until the test ends).
    public static func temporaryDirectory(_ prefix: String = "kh") -> String {
        var template = Array("/tmp/\(prefix)-XXXXXX".utf8CString)
        guard let p = mkdtemp(&template) else { fatalError("mkdtemp failed") }
        let path = String(cString: p)
        MadeDirectories.shared.add(path)
        return path
    }
}

/// The directories `TestPaths.temporaryDirectory` made, removed at exit (a run used to leave
/// dozens behind in /tmp).
private final class MadeDirectories: @unchecked Sendable {
    static let shared: MadeDirectories = {
        atexit { MadeDirectories.shared.removeAll() }
        return MadeDirectories()
    }()
    private let lock = NSLock()
    private var paths: [String] = []

    func add(_ path: String) {
        lock.lock()
        paths.append(path)
        lock.unlock()
    }

    func removeAll() {
        lock.lock()
        let made = paths
        paths = []
        lock.unlock()
        for path in made { try? FileManager.default.removeItem(atPath: path) }
    }
}

/// Whether a stream socket at `path` accepts a connection now (the connection is closed again).
public func socketAccepts(_ path: String) -> Bool {
    let fd = connectUnixSocket(path)
    if fd >= 0 { close(fd) }
    return fd >= 0
}

/// The address of the Unix socket at `path` and its length, or nil when the path is too long.
func unixSocketAddress(_ path: String) -> (sockaddr_un, socklen_t)? {
    var addr = sockaddr_un()
    addr.sun_family = sa_family_t(AF_UNIX)
    let bytes = Array(path.utf8)
    guard bytes.count < MemoryLayout.size(ofValue: addr.sun_path) else { return nil }
    withUnsafeMutableBytes(of: &addr.sun_path) { raw in raw.copyBytes(from: bytes); raw[bytes.count] = 0 }
    return (addr, socklen_t(MemoryLayout<sa_family_t>.size + bytes.count + 1))
}

/// A stream socket connected to `path`, or -1.
public func connectUnixSocket(_ path: String) -> Int32 {
    guard let (addr, len) = unixSocketAddress(path) else { return -1 }
    let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
    guard fd >= 0 else { return -1 }
    let rc = withUnsafePointer(to: addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, len) } }
    guard rc == 0 else { close(fd); return -1 }
    return fd
}

/// A listening Unix stream socket (close-on-exec) bound at `path`, for a test that plays the
/// broker's side of a connection; -1 when it could not be bound or listen.
public func listeningUnixSocket(at path: String, backlog: Int32) -> Int32 {
    guard let (addr, len) = unixSocketAddress(path) else { return -1 }
    let listener = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
    guard listener >= 0 else { return -1 }
    let bound = withUnsafePointer(to: addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(listener, $0, len) } }
    guard bound == 0, listen(listener, backlog) == 0 else { close(listener); return -1 }
    return listener
}

/// The result of running a command.
public struct CommandResult: Sendable {
    public let status: Int32
    public let stdout: [UInt8]
    public let stderr: String
    public var stdoutText: String { String(decoding: stdout, as: UTF8.self) }
}

/// Runs `path` with `arguments`, feeding `stdin`, with no controlling terminal (a new
/// session), so prompts can only come from an askpass program.
@discardableResult
public func runCommand(_ path: String, _ arguments: [String], stdin: [UInt8] = [], environment: [String: String] = [:],
                       asUser: String? = nil) -> CommandResult {
    ignoreBrokenPipes
    let p = Process()
    var args = arguments
    var exe = path
    if let user = asUser {
        // setpriv drops to the user; the command itself then runs unprivileged.
        args = ["--reuid=\(user)", "--regid=\(user)", "--init-groups", "--", path] + arguments
        exe = "/usr/bin/setpriv"
    }
    p.executableURL = URL(fileURLWithPath: "/usr/bin/setsid")
    p.arguments = ["-w", exe] + args
    var env = ProcessInfo.processInfo.environment
    env.removeValue(forKey: "KEYHOLD_ASKPASS")
    for (k, v) in environment { env[k] = v }
    p.environment = env
    let inPipe = Pipe(), outPipe = Pipe(), errPipe = Pipe()
    p.standardInput = inPipe
    p.standardOutput = outPipe
    p.standardError = errPipe
    do { try p.run() } catch { return CommandResult(status: -1, stdout: [], stderr: "cannot run \(path): \(error)") }
    let writer = Thread {
        // A command may exit without reading its stdin: EPIPE then, not a trap.
        if !stdin.isEmpty { try? inPipe.fileHandleForWriting.write(contentsOf: Data(stdin)) }
        try? inPipe.fileHandleForWriting.close()
    }
    writer.start()
    let errBox = DataBox()
    let errReader = Thread { errBox.set(errPipe.fileHandleForReading.readDataToEndOfFile()) }
    errReader.start()
    let out = outPipe.fileHandleForReading.readDataToEndOfFile()
    p.waitUntilExit()
    while !errBox.done { usleep(1000) }
    return CommandResult(status: p.terminationStatus, stdout: [UInt8](out), stderr: String(decoding: errBox.data, as: UTF8.self))
}

final class LinesBox: @unchecked Sendable {
    private let lock = NSLock()
    private var value: [String] = []
    func append(_ s: String) { lock.lock(); value.append(s); lock.unlock() }
    var lines: [String] { lock.lock(); defer { lock.unlock() }; return value }
}

final class DataBox: @unchecked Sendable {
    private let lock = NSLock()
    private var value = Data()
    private var finished = false
    func set(_ d: Data) { lock.lock(); value = d; finished = true; lock.unlock() }
    var done: Bool { lock.lock(); defer { lock.unlock() }; return finished }
    var data: Data { lock.lock(); defer { lock.unlock() }; return value }
}

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

/// A throwaway unprivileged account, removed again on deinit.
public final class TestUser: @unchecked Sendable {
    public let name: String
    public let uid: UInt32

    /// Names are unique within this test process (a counter), and across processes by pid;
    /// a name left behind by a killed run is skipped.
    private static let next = Mutex(0)

    public init(prefix: String = "khu") throws {
        var made: (String, UInt32)?
        var lastError = ""
        for _ in 0..<20 where made == nil {
            let n = Self.next.withLock { $0 += 1; return $0 }
            let candidate = "\(prefix)\(getpid() % 100000)x\(n)"
            let r = runCommand("/usr/sbin/useradd", ["-M", "-s", "/usr/sbin/nologin", candidate])
            if r.status == 0, let pw = getpwnam(candidate) {
                made = (candidate, pw.pointee.pw_uid)
            } else {
                lastError = r.stderr
                usleep(50_000)  // another test's useradd may hold /etc/passwd's lock
            }
        }
        guard let made else { throw FixtureError.brokerDidNotStart("useradd failed: \(lastError)") }
        (name, uid) = made
    }

    deinit { runCommand("/usr/sbin/userdel", [name]) }
}
