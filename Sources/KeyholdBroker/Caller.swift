import Glibc
import CKeyholdOS

/// Who is calling, as the kernel says: `SO_PEERCRED` uid and pid, then what /proc shows for
/// that pid. Nothing here comes from what the client sent.
struct Caller: Sendable {
    let uid: UInt32
    let gid: UInt32
    let pid: Int32
    /// `/proc/PID/exe`, or "?" when it cannot be read (the process is gone).
    let executable: String
    /// Login session (`getsid`), which scopes authentication reuse windows.
    let sessionID: Int32
    /// passwd name of `uid`; nil when the uid has no passwd entry (no PAM possible).
    let userName: String?

    /// Reads the peer's credentials. A socket whose peer cannot be identified is refused.
    static func identify(socket fd: Int32) -> Caller? {
        var pid: Int32 = 0, uid: UInt32 = 0, gid: UInt32 = 0
        guard ckh_peercred(fd, &pid, &uid, &gid) == 0, pid > 0 else { return nil }
        return Caller(uid: uid, gid: gid, pid: pid, executable: ProcessFacts.executable(pid: pid) ?? "?",
                      sessionID: ProcessFacts.sessionID(pid: pid) ?? -1, userName: ProcessFacts.userName(uid: uid))
    }
}

/// Small /proc and passwd readers used to describe a caller.
enum ProcessFacts {
    static func executable(pid: Int32) -> String? {
        var buf = [CChar](repeating: 0, count: 4096)
        let n = readlink("/proc/\(pid)/exe", &buf, buf.count - 1)
        guard n > 0 else { return nil }
        return String(decoding: buf[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// Field 6 of /proc/PID/stat. The comm field (2) may contain spaces and parentheses, so
    /// parse after the last ')'.
    static func sessionID(pid: Int32) -> Int32? {
        guard let stat = readSmallFile("/proc/\(pid)/stat"), let close = stat.lastIndex(of: UInt8(ascii: ")")) else { return nil }
        let fields = stat[(close + 1)...].split(separator: UInt8(ascii: " "))
        // after ')': state(3) ppid(4) pgrp(5) session(6)
        guard fields.count > 3 else { return nil }
        return Int32(String(decoding: fields[3], as: UTF8.self))
    }

    static func userName(uid: UInt32) -> String? {
        var pwd = passwd()
        var result: UnsafeMutablePointer<passwd>?
        var buf = [CChar](repeating: 0, count: 4096)
        guard getpwuid_r(uid, &pwd, &buf, buf.count, &result) == 0, result != nil, let name = pwd.pw_name else { return nil }
        return String(cString: name)
    }

    static func readSmallFile(_ path: String) -> [UInt8]? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var out: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 1024)
        while out.count < 65536 {
            let n = read(fd, &chunk, chunk.count)
            if n <= 0 { break }
            out.append(contentsOf: chunk[0..<n])
        }
        return out
    }
}
