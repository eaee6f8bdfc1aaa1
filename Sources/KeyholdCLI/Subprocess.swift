import CKeyholdOS
import Glibc
import KeyholdCore

/// Starting a child program without Foundation: posix_spawn with an explicit argv and
/// environment. Used for the askpass program and for the demo's broker.
enum Subprocess {
    /// Spawns `path` with `arguments`; stdout to `stdoutFD` when given. Returns the pid.
    static func spawn(_ path: String, _ arguments: [String], environment: [String]? = nil,
                      stdinFD: Int32? = nil, stdoutFD: Int32? = nil, stderrFD: Int32? = nil) -> pid_t? {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        if let fd = stdinFD { posix_spawn_file_actions_adddup2(&actions, fd, 0) }
        if let fd = stdoutFD { posix_spawn_file_actions_adddup2(&actions, fd, 1) }
        if let fd = stderrFD { posix_spawn_file_actions_adddup2(&actions, fd, 2) }
        // The child gets standard input, output and error, nothing else: not our pipes or
        // sockets, nor a descriptor our own parent left open without close-on-exec.
        ckh_spawn_closefrom(&actions, 3)
        let argv = ([path] + arguments).map { strdup($0) } + [nil]
        defer { argv.forEach { free($0) } }
        let envStrings = environment ?? currentEnvironment()
        let envp = envStrings.map { strdup($0) } + [nil]
        defer { envp.forEach { free($0) } }
        var pid: pid_t = 0
        let rc = posix_spawn(&pid, path, &actions, nil, argv, envp)
        return rc == 0 ? pid : nil
    }

    /// Waits for `pid`; the exit status, or nil if it died from a signal.
    static func wait(_ pid: pid_t) -> Int32? {
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 {
            if errno != EINTR { return nil }
        }
        return exitStatus(status)
    }

    /// Waits for `pid` until `deadline` (a `MonotonicClock.milliseconds` value), then kills it. The exit
    /// status, or nil if it died from a signal or was killed.
    static func wait(_ pid: pid_t, deadline: Int64) -> Int32? {
        while true {
            var status: Int32 = 0
            let r = waitpid(pid, &status, WNOHANG)
            if r == pid { return exitStatus(status) }
            if r < 0 && errno != EINTR { return nil }
            if MonotonicClock.milliseconds() >= deadline {
                kill(pid, SIGKILL)
                _ = wait(pid)
                return nil
            }
            usleep(10_000)
        }
    }

    // WIFEXITED / WEXITSTATUS are macros Swift does not import.
    private static func exitStatus(_ status: Int32) -> Int32? {
        status & 0x7f == 0 ? (status >> 8) & 0xff : nil
    }

    static func currentEnvironment() -> [String] {
        var out: [String] = []
        var p = environ
        while let entry = p.pointee {
            out.append(String(cString: entry))
            p += 1
        }
        return out
    }
}
