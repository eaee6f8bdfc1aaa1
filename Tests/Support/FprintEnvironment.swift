// A private fingerprint stack for tests: its own "system" D-Bus, a polkit stand-in that
// authorizes every fprintd action, and the real fprintd driving libfprint's virtual reader,
// all rooted in one short temp dir. Nothing here touches /var/lib/fprint or the machine's bus.
import Foundation
import Glibc

public enum FprintEnvironmentError: Error, CustomStringConvertible {
    case missingProgram(String)
    case startFailed(String, log: String)
    case commandFailed(String, status: Int32, output: String)

    public var description: String {
        switch self {
        case .missingProgram(let p): return "fprint environment: \(p) is not installed"
        case .startFailed(let what, let log): return "fprint environment: \(what) did not start\n\(log)"
        case .commandFailed(let what, let status, let output):
            return "fprint environment: \(what) failed (status \(status))\n\(output)"
        }
    }
}

/// One background "finger on the reader": started before the call that waits for a finger,
/// it sends its reader commands once fprintd's device reports `finger-needed`.
public final class FprintTouch: @unchecked Sendable {
    private let process: SpawnedProcess

    init(process: SpawnedProcess) { self.process = process }

    /// Waits for the touch to finish. True when the commands were sent (someone asked for a
    /// finger in time), false when nobody did or it was cancelled.
    @discardableResult
    public func wait(timeout: Double = 30) -> Bool {
        if !process.waitForExit(timeout: timeout) {
            cancel()
            return false
        }
        return process.exitCode == 0
    }

    /// Stops a touch that is still waiting (for tests where no finger is ever asked for).
    public func cancel() {
        process.stop()
    }

    var isRunning: Bool { process.isRunning }
}

/// A running private fprintd. Start with `start(driver:)` or, better, `withFprintEnvironment`,
/// which stops it even when the test throws. One environment = one fprintd = one reader, so
/// tests sharing an environment must run serialized.
public final class FprintEnvironment: @unchecked Sendable {
    public enum Driver: Sendable {
        /// `virtual_device`: verifies only the first enrolled finger (no identify), 5 stages.
        case virtualDevice
        /// `virtual_device_storage`: identifies any enrolled finger, 6 stages.
        case virtualDeviceStorage

        var name: String { self == .virtualDevice ? "virtual_device" : "virtual_device_storage" }
        var socketVariable: String { self == .virtualDevice ? "FP_VIRTUAL_DEVICE" : "FP_VIRTUAL_DEVICE_STORAGE" }
    }

    public static let fprintd = "/usr/libexec/fprintd"
    public static let fprintdEnroll = "/usr/bin/fprintd-enroll"
    public static let dbusDaemon = "/usr/bin/dbus-daemon"
    // python3-dbusmock and python3-dbus are Debian packages: the pyenv python on PATH lacks them.
    public static let systemPython = "/usr/bin/python3"
    public static let fpctl: String = {
        // Tests/Support/FprintEnvironment.swift -> Tests/fixtures/fprint/fpctl.py
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("fixtures/fprint/fpctl.py").path
    }()

    public let driver: Driver
    /// Root of everything this environment writes (e.g. /tmp/khfp-Ab12Cd; short for sun_path).
    public let directory: String
    /// For `DBUS_SYSTEM_BUS_ADDRESS` of anything that should talk to this fprintd.
    public let busAddress: String
    /// fprintd's STATE_DIRECTORY: prints live in `<stateDirectory>/<user>/<driver>/<dev>/<finger>`.
    public var stateDirectory: String { directory + "/state" }
    /// The virtual reader's socket (created by the driver when fprintd opens the device).
    public var deviceSocket: String { directory + "/vdev.sock" }
    public var fprintdLogPath: String { directory + "/fprintd.log" }

    let lock = NSLock()
    private var dbus: SpawnedProcess?
    private var polkit: SpawnedProcess?
    private var fprintdProcess: SpawnedProcess?
    private var touches: [FprintTouch] = []
    private var stopped = false
    /// Held (shared flock on `owner`) while this environment lives: how `reapAbandoned` of
    /// another test process, in any PID namespace, tells a live environment from an abandoned one.
    private var ownerLock: Int32 = -1
    var logCounter = 0
    /// user → finger → print id, as enrolled through this environment.
    private var enrolledPrints: [String: [String: String]] = [:]
    /// Prints the storage reader must be given again after a restart (see `restart()`).
    private var pendingInserts: [String] = []

    private init(driver: Driver, directory: String, busAddress: String) {
        self.driver = driver
        self.directory = directory
        self.busAddress = busAddress
    }

    /// Pids of the daemons this environment started and still tracks (bus, polkit mock, fprintd).
    public var processIDs: [Int32] {
        lock.withLock { [dbus, polkit, fprintdProcess].compactMap { $0?.pid } }
    }

    public var fprintdProcessID: Int32? { lock.withLock { fprintdProcess?.pid } }

    // MARK: start / restart / stop

    public static func start(driver: Driver = .virtualDevice) throws -> FprintEnvironment {
        for p in [fprintd, fprintdEnroll, dbusDaemon, systemPython] where access(p, X_OK) != 0 {
            throw FprintEnvironmentError.missingProgram(p)
        }
        guard access(fpctl, R_OK) == 0 else { throw FprintEnvironmentError.missingProgram(fpctl) }
        reapAbandoned()
        var template = Array("/tmp/khfp-XXXXXX".utf8CString)
        guard let made = template.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }) else {
            throw FprintEnvironmentError.startFailed("temp dir", log: "mkdtemp errno \(errno)")
        }
        let dir = String(cString: made)
        // 0755 like /var/lib/fprint, so a non-root test client can reach the bus socket;
        // fprintd itself makes each user's print directory 0700.
        chmod(dir, 0o755)
        mkdir(dir + "/state", 0o755)
        mkdir(dir + "/run", 0o755)
        mkdir(dir + "/logs", 0o755)
        // Before `owner` appears: a reaper reads it to leave other namespaces' environments alone.
        try? pidNamespace().write(toFile: dir + "/pidns", atomically: true, encoding: .utf8)
        let ownerLock = lockedOwnerFile(dir)
        guard ownerLock >= 0 else {
            removeTree(dir)
            throw FprintEnvironmentError.startFailed("owner file", log: "errno \(errno)")
        }
        do {
            try busConfig(dir).write(toFile: dir + "/system-bus.conf", atomically: false, encoding: .utf8)
        } catch {
            close(ownerLock)
            removeTree(dir)
            throw error
        }

        // --nofork keeps the bus our own child, so stop() can reap it.
        let busLog = dir + "/dbus.log"
        let bus: SpawnedProcess
        do {
            bus = try launch(dbusDaemon, ["--config-file=\(dir)/system-bus.conf", "--nofork", "--print-address=1"],
                             environment: baseEnvironment(), log: busLog)
        } catch {
            removeTree(dir)
            throw error
        }
        var address: String?
        let deadline = Date().addingTimeInterval(10)
        while address == nil, Date() < deadline, bus.isRunning {
            if let text = try? String(contentsOfFile: busLog, encoding: .utf8),
               let line = text.split(separator: "\n").first(where: { $0.hasPrefix("unix:") }) {
                address = String(line)
            } else {
                usleep(10_000)
            }
        }
        guard let address else {
            bus.stop()
            let log = (try? String(contentsOfFile: busLog, encoding: .utf8)) ?? ""
            removeTree(dir)
            throw FprintEnvironmentError.startFailed("dbus-daemon", log: log)
        }

        recordDaemon(bus, in: dir)
        let env = FprintEnvironment(driver: driver, directory: dir, busAddress: address)
        env.ownerLock = ownerLock
        env.dbus = bus
        do {
            let polkit = try launch(systemPython, ["-m", "dbusmock", "--system", "--template", "polkitd"],
                                    environment: env.childEnvironment(), log: dir + "/polkitd.log")
            recordDaemon(polkit, in: dir)
            env.polkit = polkit
            try env.startFprintd()
            try env.fpctlRun(["ready", "10"], what: "waiting for polkit mock and fprintd", timeout: 20)
        } catch {
            let logs = env.logs()
            env.stop()
            if case FprintEnvironmentError.commandFailed(let what, let status, let output) = error {
                throw FprintEnvironmentError.commandFailed(what, status: status, output: output + "\n" + logs)
            }
            throw error
        }
        return env
    }

    /// Restarts fprintd on the same bus and state directory. libfprint models the virtual
    /// reader's heat per process; after ~180 s of cumulative waiting it reports "overheated"
    /// and fails every verify, so suites restart it per test group.
    /// The storage reader keeps its on-device prints in memory only, so after a restart it
    /// no longer matches anything (seen: 11); the next touch therefore first re-inserts
    /// (`INSERT id`) every print enrolled through this environment.
    public func restart() throws {
        try stopFprintd()
        if driver == .virtualDeviceStorage {
            lock.withLock { pendingInserts = enrolledPrints.values.flatMap { $0.values }.sorted() }
        }
        try startFprintd()
        try fpctlRun(["wait-name", "net.reactivated.Fprint", "10"], what: "waiting for fprintd", timeout: 20)
    }

    /// Stops fprintd only (bus and polkit mock stay): "no fingerprint service" for tests of
    /// a fallback. `restart()` brings it back with the same prints.
    public func stopFprintd() throws {
        let old = lock.withLock { () -> SpawnedProcess? in
            let p = fprintdProcess
            fprintdProcess = nil
            return p
        }
        guard let old else { return }
        old.stop()
        try fpctlRun(["wait-gone", "net.reactivated.Fprint", "10"], what: "fprintd leaving the bus", timeout: 20)
    }

    /// Kills only the processes this environment started (touches, fprintd, polkit mock, bus),
    /// waits for each to be gone, and removes the directory. Safe to call twice.
    public func stop() {
        let (ts, procs) = lock.withLock { () -> ([FprintTouch], [SpawnedProcess]) in
            if stopped { return ([], []) }
            stopped = true
            let ps = [fprintdProcess, polkit, dbus].compactMap { $0 }
            fprintdProcess = nil; polkit = nil; dbus = nil
            let t = touches
            touches = []
            return (t, ps)
        }
        if procs.isEmpty && ts.isEmpty { return }
        for t in ts { t.cancel() }
        for p in procs { p.stop() }
        unlink(directory + "/owner")  // stopped properly: nothing here for reapAbandoned()
        lock.withLock {
            if ownerLock >= 0 { close(ownerLock) }
            ownerLock = -1
        }
        if ProcessInfo.processInfo.environment["KEYHOLD_KEEP_FPRINT_DIR"] == nil {
            Self.removeTree(directory)
        }
    }

    deinit { stop() }

    private func startFprintd() throws {
        // Remove a socket left by an earlier fprintd so the new driver can bind the path.
        unlink(deviceSocket)
        var env = childEnvironment()
        env[driver.socketVariable] = deviceSocket
        // FP_DRIVERS_WHITELIST is what libfprint 1.94.5 (bookworm) reads; ALLOWLIST is newer.
        env["FP_DRIVERS_WHITELIST"] = driver.name
        env["FP_DRIVERS_ALLOWLIST"] = driver.name
        env["STATE_DIRECTORY"] = stateDirectory
        env["RUNTIME_DIRECTORY"] = directory + "/run"
        env["G_MESSAGES_DEBUG"] = "all"
        // -t: do not exit when idle (it expects bus activation, which this bus does not do).
        let p = try Self.launch(Self.fprintd, ["-t"], environment: env, log: fprintdLogPath)
        Self.recordDaemon(p, in: directory)
        lock.withLock { fprintdProcess = p }
    }

    // MARK: enrolment

    /// Enrolls `finger` of `user` with the virtual print `print`, through the real
    /// fprintd-enroll. The user need not exist in /etc/passwd.
    public func enroll(user: String, finger: String = "right-index-finger", print: String) throws {
        let feeder = try fpctlLaunch(["feed-enroll", deviceSocket, print, "15"], name: "feed-enroll")
        let log = nextLog("enroll")
        let enroller: SpawnedProcess
        do {
            enroller = try Self.launch(Self.fprintdEnroll, ["-f", finger, user], environment: childEnvironment(), log: log)
        } catch {
            feeder.stop()
            throw error
        }
        let enrolled = enroller.waitForExit(timeout: 30)
        if !enrolled { enroller.stop() }
        if !feeder.waitForExit(timeout: 5) { feeder.stop() }
        let output = (try? String(contentsOfFile: log, encoding: .utf8)) ?? ""
        guard enrolled, enroller.exitCode == 0, output.contains("enroll-completed") else {
            throw FprintEnvironmentError.commandFailed("fprintd-enroll", status: enroller.exitCode ?? -1, output: output)
        }
        lock.withLock { enrolledPrints[user, default: [:]][finger] = print }
    }

    /// Deletes one enrolled finger (Claim, DeleteEnrolledFinger, Release on one connection).
    public func deleteFinger(user: String, finger: String) throws {
        try fpctlRun(["delete", user, finger], what: "delete \(finger)")
        lock.withLock { _ = enrolledPrints[user]?.removeValue(forKey: finger) }
    }

    /// Deletes every enrolled finger of `user` (fprintd removes the user's directory).
    public func deleteAll(user: String) throws {
        try fpctlRun(["delete-all", user], what: "delete all")
        lock.withLock { _ = enrolledPrints.removeValue(forKey: user) }
    }

    /// fprintd's own answer (ListEnrolledFingers), to cross-check what the files say.
    public func enrolledFingers(user: String) throws -> [String] {
        let out = try fpctlRun(["list", user], what: "list")
        return out.split(whereSeparator: { $0 == " " || $0 == "\n" }).map(String.init)
    }

    /// The default device's `name` property ("Virtual device for debugging").
    public func deviceName() throws -> String {
        try fpctlRun(["device-name"], what: "device name").trimmingCharacters(in: .whitespacesAndNewlines)
    }

    // MARK: the reader

    /// Blocks until a verify or enroll is waiting for a finger. False on timeout.
    public func waitUntilFingerNeeded(timeout: Double) -> Bool {
        (try? fpctlRun(["wait-finger-needed", String(timeout)], what: "wait", timeout: timeout + 10)) != nil
    }

    /// Starts a background touch: when the reader is asked for a finger, print `print` is
    /// scanned. Start it before the call that waits for a finger, then `wait()` on it.
    public func scan(print: String, timeout: Double = 15) throws -> FprintTouch {
        try touch(["SCAN \(print)"], timeout: timeout)
    }

    /// Starts a background touch that makes the reader report a device error (`ERROR n`,
    /// 0 = general) once a finger is asked for: the fast stand-in for "no scan" (pam_fprintd's
    /// timeout cannot go below 10 s in this build).
    public func reportError(_ code: Int = 0, timeout: Double = 15) throws -> FprintTouch {
        try touch(["ERROR \(code)"], timeout: timeout)
    }

    /// Any queued virtual-device commands (`SCAN id`, `ERROR n`, `RETRY n`, ...), sent in
    /// order once a finger is asked for.
    public func touch(_ commands: [String], timeout: Double = 15) throws -> FprintTouch {
        let inserts = lock.withLock { () -> [String] in
            defer { pendingInserts = [] }
            return pendingInserts.map { "INSERT \($0)" }
        }
        let p = try fpctlLaunch(["touch", deviceSocket, String(timeout)] + inserts + commands, name: "touch")
        let t = FprintTouch(process: p)
        lock.withLock {
            touches.removeAll { !$0.isRunning }
            touches.append(t)
        }
        return t
    }

    /// One immediate virtual-device command; the device must be claimed (only LIST replies).
    @discardableResult
    public func send(_ command: String) throws -> String {
        try fpctlRun(["send", deviceSocket, command], what: "send")
    }

    // MARK: diagnostics

    /// The daemons' logs, for a failing test's message (no secrets pass through them).
    public func logs() -> String {
        ["dbus.log", "polkitd.log", "fprintd.log"].map { name in
            let text = (try? String(contentsOfFile: directory + "/" + name, encoding: .utf8)) ?? ""
            return "--- \(name)\n" + String(text.suffix(4000))
        }.joined(separator: "\n")
    }

    /// True while `pid` is a live process; a zombie awaiting its reaper counts as gone.
    public static func isAlive(_ pid: Int32) -> Bool {
        guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8) else { return false }
        let state = status.split(separator: "\n").first { $0.hasPrefix("State:") } ?? ""
        return !state.contains("Z")
    }

    // MARK: crash safety net

    /// What the death of the owning process does to its lock (the reaper's test uses it).
    public func dropOwnerLockAsIfCrashed() {
        lock.withLock {
            if ownerLock >= 0 { close(ownerLock) }
            ownerLock = -1
        }
    }
}

/// Runs `body` with a fresh environment and always stops it afterwards, also on a throw.
public func withFprintEnvironment<R>(driver: FprintEnvironment.Driver = .virtualDevice,
                                     _ body: (FprintEnvironment) throws -> R) throws -> R {
    let env = try FprintEnvironment.start(driver: driver)
    defer { env.stop() }
    return try body(env)
}

public func withFprintEnvironment<R>(driver: FprintEnvironment.Driver = .virtualDevice,
                                     isolation: isolated (any Actor)? = #isolation,
                                     _ body: (FprintEnvironment) async throws -> R) async throws -> R {
    let env = try FprintEnvironment.start(driver: driver)
    defer { env.stop() }
    return try await body(env)
}
