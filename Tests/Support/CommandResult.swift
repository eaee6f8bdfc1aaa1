import Foundation
import Glibc
import Synchronization

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
    var extra = environment
    if let user = asUser {
        // setpriv drops to the user; the command itself then runs unprivileged, so the fixture
        // files it names are given as copies it can read (ReadableCopies).
        args = ["--reuid=\(user)", "--regid=\(user)", "--init-groups", "--", ReadableCopies.forOtherUsers(path)]
            + arguments.map(ReadableCopies.forOtherUsers)
        exe = "/usr/bin/setpriv"
        extra = extra.mapValues(ReadableCopies.forOtherUsers)
    }
    p.executableURL = URL(fileURLWithPath: "/usr/bin/setsid")
    p.arguments = ["-w", exe] + args
    var env = ProcessInfo.processInfo.environment
    env.removeValue(forKey: "KEYHOLD_ASKPASS")
    for (k, v) in extra { env[k] = v }
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
