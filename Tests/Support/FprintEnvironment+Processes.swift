import Foundation
import Glibc

/// How the environment starts its processes: the private bus's configuration, the children's
/// environment (the private bus only), numbered logs, and `fpctl` (libfprint's virtual reader).
extension FprintEnvironment {
    /// A private bus of type "system" that lets everyone do everything (it only ever carries
    /// test traffic). No <servicedir>: nothing is bus-activated, only what we start runs.
    static func busConfig(_ dir: String) -> String {
        """
        <!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
         "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
        <busconfig>
          <type>system</type>
          <keep_umask/>
          <listen>unix:path=\(dir)/bus.sock</listen>
          <auth>EXTERNAL</auth>
          <policy context="default">
            <allow user="*"/>
            <allow own="*"/>
            <allow send_destination="*" eavesdrop="true"/>
            <allow eavesdrop="true"/>
          </policy>
        </busconfig>

        """
    }

    /// Environment for every child: the private bus only, and no pam_wrapper preload leaking in.
    func childEnvironment() -> [String: String] {
        var env = Self.baseEnvironment()
        env["DBUS_SYSTEM_BUS_ADDRESS"] = busAddress
        return env
    }

    static func baseEnvironment() -> [String: String] {
        var env = ProcessInfo.processInfo.environment
        for k in ["LD_PRELOAD", "PAM_WRAPPER", "PAM_WRAPPER_SERVICE_DIR", "DBUS_SESSION_BUS_ADDRESS",
                  "DBUS_SYSTEM_BUS_ADDRESS", "FP_VIRTUAL_DEVICE", "FP_VIRTUAL_DEVICE_STORAGE", "STATE_DIRECTORY"] {
            env.removeValue(forKey: k)
        }
        return env
    }

    func nextLog(_ name: String) -> String {
        let n = lock.withLock { () -> Int in logCounter += 1; return logCounter }
        return "\(directory)/logs/\(n)-\(name).log"
    }

    func fpctlLaunch(_ args: [String], name: String) throws -> SpawnedProcess {
        try Self.launch(Self.systemPython, [Self.fpctl] + args, environment: childEnvironment(), log: nextLog(name))
    }

    @discardableResult
    func fpctlRun(_ args: [String], what: String, timeout: Double = 30) throws -> String {
        let log = nextLog(args[0])
        let p = try Self.launch(Self.systemPython, [Self.fpctl] + args, environment: childEnvironment(), log: log)
        let done = p.waitForExit(timeout: timeout)
        if !done { p.stop() }
        let output = (try? String(contentsOfFile: log, encoding: .utf8)) ?? ""
        guard done, p.exitCode == 0 else {
            throw FprintEnvironmentError.commandFailed(what, status: p.exitCode ?? -1, output: output)
        }
        return output
    }

    static func launch(_ path: String, _ args: [String], environment: [String: String],
                       log: String) throws -> SpawnedProcess {
        do {
            return try SpawnedProcess.spawn(path, args, environment: environment, log: log)
        } catch {
            throw FprintEnvironmentError.startFailed(path, log: "\(error)")
        }
    }
}
