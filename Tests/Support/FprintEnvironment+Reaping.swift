import Foundation
import Glibc

/// The crash safety net: a test process that dies never runs `stop()`, so each `start()`
/// reaps the environments whose owner is gone (their daemons, then their directory).
extension FprintEnvironment {
    /// `owner` (the creating pid, for people reading /tmp), under a shared flock the owner holds
    /// until stop() or its death. Created under another name and renamed once locked, so a
    /// reaper never sees it unlocked while its owner lives. The fd, or -1.
    static func lockedOwnerFile(_ dir: String) -> Int32 {
        let fd = open(dir + "/owner.new", O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o644)
        guard fd >= 0 else { return -1 }
        let line = Array("\(getpid())\n".utf8)
        guard flock(fd, LOCK_SH) == 0, write(fd, line, line.count) == line.count,
              rename(dir + "/owner.new", dir + "/owner") == 0 else {
            close(fd)
            return -1
        }
        return fd
    }

    /// A test process that crashes never runs stop(), and its daemons would outlive it. So
    /// each start() first reaps environments whose owner process is gone (nobody holds the
    /// lock on its `owner` file; a pid would not do, as runs in other PID namespaces share
    /// /tmp and their pids mean nothing here): it SIGKILLs only
    /// pids recorded in that environment's `daemons` file whose command line or environment
    /// still names that directory (a recycled pid does not), then removes the directory.
    /// Environments of live test processes (another suite, another run) are left alone, and so
    /// are those made in another PID namespace (a suite run under `unshare --pid` beside this
    /// one): their daemons can be neither seen nor killed from here, so removing the directory
    /// would only leave them running.
    public static func reapAbandoned() {
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: "/tmp") else { return }
        let mine = pidNamespace()
        for name in names where name.hasPrefix("khfp-") && name.utf8.count == 11 {
            let dir = "/tmp/" + name
            if let theirs = try? String(contentsOfFile: dir + "/pidns", encoding: .utf8), theirs != mine { continue }
            let owner = open(dir + "/owner", O_RDONLY | O_CLOEXEC)
            guard owner >= 0 else { continue }
            let abandoned = flock(owner, LOCK_EX | LOCK_NB) == 0
            close(owner)
            guard abandoned else { continue }
            let recorded = (try? String(contentsOfFile: dir + "/daemons", encoding: .utf8)) ?? ""
            var killed: [Int32] = []
            for line in recorded.split(separator: "\n") {
                if let pid = Int32(line), isAlive(pid), process(pid, mentions: dir), kill(pid, SIGKILL) == 0 {
                    killed.append(pid)
                }
            }
            let deadline = Date().addingTimeInterval(5)
            while killed.contains(where: isAlive), Date() < deadline { usleep(5_000) }
            removeTree(dir)
        }
    }

    /// This process's PID namespace, as /proc names it ("pid:[4026531836]").
    public static func pidNamespace() -> String {
        (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/ns/pid")) ?? "unknown"
    }

    static func recordDaemon(_ p: SpawnedProcess, in dir: String) {
        let fd = open(dir + "/daemons", O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o644)
        guard fd >= 0 else { return }
        defer { close(fd) }
        let line = Array("\(p.pid)\n".utf8)
        _ = line.withUnsafeBytes { write(fd, $0.baseAddress!, $0.count) }
    }

    static func process(_ pid: Int32, mentions dir: String) -> Bool {
        let needle = Array(dir.utf8)
        for file in ["cmdline", "environ"] {
            guard let data = FileManager.default.contents(atPath: "/proc/\(pid)/\(file)") else { continue }
            let hay = [UInt8](data)
            if hay.count >= needle.count {
                for i in 0...(hay.count - needle.count) where hay[i] == needle[0] && Array(hay[i..<(i + needle.count)]) == needle {
                    return true
                }
            }
        }
        return false
    }

    static func removeTree(_ path: String) {
        try? FileManager.default.removeItem(atPath: path)
    }
}
