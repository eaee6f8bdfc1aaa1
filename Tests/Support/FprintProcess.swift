// Child processes for test fixtures, spawned with a clean signal state.
//
// Why not Foundation's Process: children inherit the spawning thread's signal mask, and the
// threads tests run on (Swift concurrency / Dispatch workers) block almost every signal,
// SIGTERM included. A daemon started through Process therefore ignores `terminate()` and
// only dies by SIGKILL (seen: SigBlk fffffffe3bfbea27 in fprintd's /proc status).
// posix_spawn with POSIX_SPAWN_SETSIGMASK (empty) and SETSIGDEF (all default) fixes that.
import Foundation
import Glibc

public enum SpawnError: Error, CustomStringConvertible {
    case spawnFailed(String, errno: Int32)
    public var description: String {
        switch self {
        case .spawnFailed(let path, let e): return "spawn \(path) failed: \(String(cString: strerror(e)))"
        }
    }
}

public final class SpawnedProcess: @unchecked Sendable {
    public let pid: pid_t
    public let path: String
    private let lock = NSLock()
    private var waitStatus: Int32?

    private init(pid: pid_t, path: String) {
        self.pid = pid
        self.path = path
    }

    /// Starts `path` with `arguments`, stdin from `stdin` (/dev/null unless given), stdout and
    /// stderr appended to `log`, no other inherited descriptors, an empty signal mask and
    /// default handlers. Unlike Process it does not start a new session: the child is in the
    /// test runner's.
    public static func spawn(_ path: String, _ arguments: [String], environment: [String: String],
                             log: String, stdin: String = "/dev/null") throws -> SpawnedProcess {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, stdin, O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, log, O_WRONLY | O_CREAT | O_APPEND, 0o644)
        posix_spawn_file_actions_adddup2(&actions, 1, 2)
        // Do not hand the test runner's pipes to a daemon (glibc >= 2.34; looked up at run
        // time because Glibc's module does not export it).
        if let sym = dlsym(nil, "posix_spawn_file_actions_addclosefrom_np") {
            typealias CloseFrom = @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32
            _ = unsafeBitCast(sym, to: CloseFrom.self)(&actions, 3)
        }

        var attr = posix_spawnattr_t()
        posix_spawnattr_init(&attr)
        defer { posix_spawnattr_destroy(&attr) }
        var none = sigset_t()
        sigemptyset(&none)
        var all = sigset_t()
        sigfillset(&all)
        posix_spawnattr_setsigmask(&attr, &none)
        posix_spawnattr_setsigdefault(&attr, &all)
        posix_spawnattr_setflags(&attr, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))

        let argv: [UnsafeMutablePointer<CChar>?] = ([path] + arguments).map { strdup($0) } + [nil]
        let envp: [UnsafeMutablePointer<CChar>?] = environment.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer {
            for p in argv { free(p) }
            for p in envp { free(p) }
        }
        var pid: pid_t = 0
        let rc = posix_spawn(&pid, path, &actions, &attr, argv, envp)
        guard rc == 0 else { throw SpawnError.spawnFailed(path, errno: rc) }
        return SpawnedProcess(pid: pid, path: path)
    }

    /// Reaps without blocking; nil while the child runs, else its raw wait status.
    private func poll() -> Int32? {
        lock.withLock {
            if let s = waitStatus { return s }
            var st: Int32 = 0
            let r = waitpid(pid, &st, WNOHANG)
            if r == pid || (r < 0 && errno == ECHILD) { waitStatus = r == pid ? st : -1 }
            return waitStatus
        }
    }

    public var isRunning: Bool { poll() == nil }

    /// The exit code when the child exited normally; nil while running or when signalled.
    public var exitCode: Int32? {
        guard let st = poll(), st >= 0, st & 0x7f == 0 else { return nil }
        return (st >> 8) & 0xff
    }

    /// The signal that ended the child, if one did.
    public var terminatingSignal: Int32? {
        guard let st = poll(), st >= 0, st & 0x7f != 0, st & 0x7f != 0x7f else { return nil }
        return st & 0x7f
    }

    /// Polls instead of blocking forever: a hung child must fail the test, not the run.
    @discardableResult
    public func waitForExit(timeout: Double) -> Bool {
        let deadline = Date().addingTimeInterval(timeout)
        while isRunning {
            if Date() >= deadline { return false }
            usleep(5_000)
        }
        return true
    }

    /// Sends `sig` only while the child is unreaped, so the pid cannot belong to anyone else.
    public func signal(_ sig: Int32) {
        lock.withLock {
            if waitStatus == nil { _ = kill(pid, sig) }
        }
    }

    /// SIGTERM, then SIGKILL after `grace` seconds; returns once the child is reaped.
    public func stop(grace: Double = 5) {
        guard isRunning else { return }
        signal(SIGTERM)
        if !waitForExit(timeout: grace) {
            signal(SIGKILL)
            waitForExit(timeout: 10)
        }
    }
}
