import Foundation
import Glibc

/// Debian's `swtpm` as a TPM 2.0 on a Unix socket, its state in a temporary directory: a
/// fresh one is a different machine's TPM. Reached through the TSS's swtpm TCTI, which expects
/// the control socket at `SOCKET.ctrl`.
public final class SoftwareTPM: @unchecked Sendable {
    public let directory: String
    public var socketPath: String { directory + "/tpm.sock" }
    public var tcti: String { "swtpm:path=\(socketPath)" }
    private var process: Process?

    public static let executable = "/usr/bin/swtpm"

    public init() throws {
        directory = TestPaths.temporaryDirectory("kht")
        mkdir(directory + "/state", 0o700)
        try start()
    }

    /// Starts (or restarts, with the same state: the same TPM) the simulator; bounded wait.
    public func start() throws {
        guard process == nil else { return }
        unlink(socketPath)
        unlink(socketPath + ".ctrl")
        let p = Process()
        p.executableURL = URL(fileURLWithPath: Self.executable)
        p.arguments = ["socket", "--tpmstate", "dir=\(directory)/state",
                       "--server", "type=unixio,path=\(socketPath)", "--ctrl", "type=unixio,path=\(socketPath).ctrl",
                       "--flags", "not-need-init,startup-clear", "--tpm2"]
        p.standardOutput = FileHandle.nullDevice
        p.standardError = FileHandle.nullDevice
        try p.run()
        process = p
        // Ready when both sockets accept (the files exist from bind, before listen: a TCTI
        // connecting in between fails). Up to 30 s: a loaded machine may be slow to start it.
        for _ in 0..<3000 {
            if socketAccepts(socketPath + ".ctrl") && socketAccepts(socketPath) { return }
            if !p.isRunning { process = nil; throw SoftwareTPMError.didNotStart("swtpm exited with \(p.terminationStatus)") }
            usleep(10_000)
        }
        stop()
        throw SoftwareTPMError.didNotStart("swtpm did not accept on its sockets within 30 s")
    }

    /// SIGKILL: the TPM disappears (its state stays on disk).
    public func stop() {
        guard let p = process else { return }
        if p.isRunning { kill(p.processIdentifier, SIGKILL) }
        p.waitUntilExit()
        process = nil
    }

    /// TPM2_Clear through the lockout hierarchy (empty auth on a fresh swtpm): new storage seed.
    public func clear() throws {
        let r = runWithTimeout("/usr/bin/tpm2_clear", ["-T", tcti, "-c", "l"], seconds: 30)
        guard r.status == 0 else { throw SoftwareTPMError.commandFailed("tpm2_clear: \(r.status) \(r.stderr)") }
    }

    /// Extends a SHA-256 PCR (as a firmware or kernel update changes a measurement).
    public func extendPCR(_ index: Int) throws {
        let digest = String(repeating: "ab", count: 32)
        let r = runWithTimeout("/usr/bin/tpm2_pcrextend", ["-T", tcti, "\(index):sha256=\(digest)"], seconds: 30)
        guard r.status == 0 else { throw SoftwareTPMError.commandFailed("tpm2_pcrextend: \(r.status) \(r.stderr)") }
    }

    /// A copy of the TPM's state as it is now (the simulator is stopped for the copy and
    /// started again): `restoreState` puts this TPM back as it was, counters included.
    public func saveState(to path: String) throws {
        stop()
        defer { try? start() }
        let r = runCommand("/bin/cp", ["-a", directory + "/state", path])
        guard r.status == 0 else { throw SoftwareTPMError.commandFailed("cp: \(r.stderr)") }
    }

    public func restoreState(from path: String) throws {
        stop()
        let r = runCommand("/bin/sh", ["-c", "rm -rf \"$1/state\" && cp -a \"$2\" \"$1/state\"", "sh", directory, path])
        guard r.status == 0 else { throw SoftwareTPMError.commandFailed("restore: \(r.stderr)") }
        try start()
    }

    /// Opens the simulator to the members of `group` as Debian opens /dev/tpmrm0 to `tss`
    /// (root:tss 0660): the sockets group-owned and group-writable, their directory searchable.
    public func shareWithGroup(_ group: String) throws {
        guard let g = getgrnam(group)?.pointee.gr_gid else { throw SoftwareTPMError.commandFailed("no group \(group)") }
        for (path, mode) in [(directory, mode_t(0o710)), (socketPath, 0o660), (socketPath + ".ctrl", 0o660)] {
            guard chown(path, 0, g) == 0, chmod(path, mode) == 0 else { throw SoftwareTPMError.commandFailed("chown \(path): \(errno)") }
        }
    }

    /// Sets the owner hierarchy's authorization (tpm2_changeauth, the value read from a file so
    /// it is in no argv) from empty to `password`.
    public func setOwnerPassword(_ password: String) throws {
        let file = directory + "/owner-auth"
        guard FileManager.default.createFile(atPath: file, contents: Data(password.utf8), attributes: [.posixPermissions: 0o600]) else {
            throw SoftwareTPMError.commandFailed("cannot write \(file)")
        }
        defer { unlink(file) }
        let r = runWithTimeout("/usr/bin/tpm2_changeauth", ["-T", tcti, "-c", "o", "file:" + file], seconds: 30)
        guard r.status == 0 else { throw SoftwareTPMError.commandFailed("tpm2_changeauth: \(r.status) \(r.stderr)") }
    }

    deinit {
        stop()
        try? FileManager.default.removeItem(atPath: directory)
    }
}

public enum SoftwareTPMError: Error, CustomStringConvertible {
    case didNotStart(String)
    case commandFailed(String)
    public var description: String {
        switch self {
        case .didNotStart(let s), .commandFailed(let s): s
        }
    }
}

/// Runs a command with a hard time bound: SIGKILL after `seconds` (status then 137), so a
/// hung TPM or broker fails the test instead of blocking the suite. Output goes through
/// files, so a chatty child can never block on a full pipe.
public func runWithTimeout(_ path: String, _ arguments: [String], environment: [String: String] = [:],
                           seconds: Double) -> CommandResult {
    let dir = TestPaths.temporaryDirectory("khr")
    defer { try? FileManager.default.removeItem(atPath: dir) }
    _ = FileManager.default.createFile(atPath: dir + "/out", contents: nil)
    _ = FileManager.default.createFile(atPath: dir + "/err", contents: nil)
    let p = Process()
    p.executableURL = URL(fileURLWithPath: path)
    p.arguments = arguments
    var env = ProcessInfo.processInfo.environment
    for (k, v) in environment { env[k] = v }
    p.environment = env
    p.standardInput = FileHandle.nullDevice
    p.standardOutput = FileHandle(forWritingAtPath: dir + "/out")
    p.standardError = FileHandle(forWritingAtPath: dir + "/err")
    do { try p.run() } catch { return CommandResult(status: -1, stdout: [], stderr: "cannot run \(path): \(error)") }
    let deadline = Date().addingTimeInterval(seconds)
    var timedOut = false
    while p.isRunning {
        if Date() > deadline { kill(p.processIdentifier, SIGKILL); timedOut = true; break }
        usleep(10_000)
    }
    p.waitUntilExit()
    let out = FileManager.default.contents(atPath: dir + "/out") ?? Data()
    let err = String(decoding: FileManager.default.contents(atPath: dir + "/err") ?? Data(), as: UTF8.self)
    let status: Int32 = p.terminationReason == .uncaughtSignal ? 128 + p.terminationStatus : p.terminationStatus
    return CommandResult(status: status, stdout: [UInt8](out), stderr: timedOut ? "TIMED OUT after \(seconds) s\n" + err : err)
}
