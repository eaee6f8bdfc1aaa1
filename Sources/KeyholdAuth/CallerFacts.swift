import Glibc
import CKeyholdOS

/// What the broker can verify about a caller process from /proc, for PAM items and policy
/// (allowed executables, reuse windows per session).
///
/// What can and cannot be faked by a process of the caller's own uid:
/// - `executable`: the kernel maintains `/proc/PID/exe`; a process cannot point it elsewhere
///   without exec'ing that file. But a same-uid process may ptrace or inject code into an
///   allowed executable (where `kernel.yama.ptrace_scope` permits), so this identifies the
///   program image, not the intent of whoever drives it. A replaced file reads `… (deleted)`.
/// - `sessionID`: a process can leave its session (setsid) but cannot join another existing one,
///   so it cannot claim someone else's reuse window; session ids are pids and are reused after
///   the session ends (pair with `startTime`).
/// - `tty`: the controlling terminal is kernel state; a process can only acquire a terminal it
///   can open, i.e. its own user's ptys. It says nothing about a human being present.
/// - `remote`: best effort. Found by walking the parents of the caller and of its session
///   leader up to an `sshd`. A process that double-forks and calls setsid loses its sshd
///   ancestry and looks local; a process that runs a binary named `sshd` looks remote (that only
///   restricts it). `SSH_CONNECTION` comes from the initial environment of sshd's child, which a
///   same-uid process can rewrite in its own memory: the address is informative, not proof.
/// - `pid` itself: the pid may be reused once the caller exits; `startTime` (clock ticks since
///   boot) lets the broker check that it is still the same process.
public struct CallerFacts: Sendable, Equatable {
    public var pid: Int32
    public var parentPID: Int32
    /// Resolved `/proc/PID/exe`; nil when it cannot be read (process gone, or not permitted).
    public var executable: String?
    /// `/proc/PID/stat` field 6.
    public var sessionID: Int32
    /// `/proc/PID/stat` field 22: start time in clock ticks after boot.
    public var startTime: UInt64
    /// Controlling terminal as a device path (`/dev/pts/N`, `/dev/ttyN`, `/dev/ttySN`), nil if none.
    public var tty: String?
    /// Non-nil when the caller descends from an sshd session.
    public var remote: RemoteSession?

    public struct RemoteSession: Sendable, Equatable {
        /// The pid of the sshd process found among the ancestors.
        public var sshdPID: Int32
        /// The client address from SSH_CONNECTION, or "remote" when it cannot be read.
        public var host: String
    }

    /// The value for PAM_RHOST: nil for a local caller.
    public var pamRemoteHost: String? { remote?.host }

    /// Reads the facts for `pid`; nil when the process does not exist (or exits while read).
    public static func read(pid: Int32) -> CallerFacts? {
        guard pid > 0, let stat = ProcStat.read(pid: pid) else { return nil }
        let remote = findRemote(pid: pid, stat: stat)
        return CallerFacts(pid: pid, parentPID: stat.ppid, executable: readExecutable(pid: pid),
                           sessionID: stat.session, startTime: stat.startTime,
                           tty: ttyPath(stat.ttyNr), remote: remote)
    }

    /// The facts without the ancestry walk (`remote` nil): what every request needs. Only a
    /// PAM conversation needs `remoteSession(of:)`, so a `policy none` get skips its /proc walk.
    public static func readLocal(pid: Int32) -> CallerFacts? {
        guard pid > 0, let stat = ProcStat.read(pid: pid) else { return nil }
        return CallerFacts(pid: pid, parentPID: stat.ppid, executable: readExecutable(pid: pid),
                           sessionID: stat.session, startTime: stat.startTime, tty: ttyPath(stat.ttyNr), remote: nil)
    }

    /// The sshd ancestry of the process `facts` describe, read now. Fails closed: when that
    /// process is gone, or its pid names another process, it counts as remote.
    public static func remoteSession(of facts: CallerFacts) -> RemoteSession? {
        guard let stat = ProcStat.read(pid: facts.pid), stat.startTime == facts.startTime else {
            return RemoteSession(sshdPID: 0, host: "remote")
        }
        return findRemote(pid: facts.pid, stat: stat)
    }

    /// The link `/proc/<pid>/exe` names, read for every request (a sender may have exec'd
    /// another program since it connected); nil when it cannot be read or fills PATH_MAX.
    public static func readExecutable(pid: Int32) -> String? {
        var buffer = [UInt8](repeating: 0, count: Int(PATH_MAX))
        let n = buffer.withUnsafeMutableBytes { readlink("/proc/\(pid)/exe", $0.baseAddress!, $0.count) }
        guard n > 0, n < buffer.count else { return nil }
        return String(decoding: buffer[0..<n], as: UTF8.self)
    }

    /// tty_nr is the kernel's encoded dev_t: major in bits 8–15, minor in 0–7 and 20–31.
    static func ttyPath(_ ttyNr: Int32) -> String? {
        guard ttyNr != 0 else { return nil }
        let t = UInt32(bitPattern: ttyNr)
        let major = (t >> 8) & 0xFFF
        let minor = (t & 0xFF) | ((t >> 12) & 0xFFF00)
        switch major {
        case 136...143: return "/dev/pts/\((major - 136) * 256 + minor)"  // Unix98 ptys
        case 4 where minor < 64: return "/dev/tty\(minor)"                 // virtual consoles
        case 4: return "/dev/ttyS\(minor - 64)"                            // serial lines
        default: return nil  // unknown driver: report no terminal rather than guess a path
        }
    }

    static let maxAncestry = 64

    /// Walks up from the caller, then from its session leader, looking for sshd.
    static func findRemote(pid: Int32, stat: ProcStat) -> RemoteSession? {
        if let r = walkToSSHD(from: pid, stat: stat) { return r }
        if stat.session > 1, stat.session != pid, let leader = ProcStat.read(pid: stat.session) {
            return walkToSSHD(from: stat.session, stat: leader)
        }
        return nil
    }

    private static func walkToSSHD(from pid: Int32, stat: ProcStat) -> RemoteSession? {
        var child = pid
        var current = stat
        for _ in 0..<maxAncestry {
            let parent = current.ppid
            guard parent > 1, let parentStat = ProcStat.read(pid: parent) else { return nil }
            if let exe = readExecutable(pid: parent), exe.split(separator: "/").last == "sshd" {
                return RemoteSession(sshdPID: parent, host: sshClientAddress(pid: child) ?? "remote")
            }
            child = parent
            current = parentStat
        }
        return nil
    }

    /// First word of SSH_CONNECTION ("client-ip client-port server-ip server-port").
    static func sshClientAddress(pid: Int32) -> String? {
        guard let env = ProcFile.read("/proc/\(pid)/environ", limit: 256 * 1024) else { return nil }
        let prefix = Array("SSH_CONNECTION=".utf8)
        for entry in env.split(separator: 0) where entry.starts(with: prefix) {
            let value = entry.dropFirst(prefix.count)
            guard let host = value.split(separator: UInt8(ascii: " ")).first, host.count <= 64,
                  host.allSatisfy({ b in (b >= 0x30 && b <= 0x39) || (b >= 0x41 && b <= 0x46) || (b >= 0x61 && b <= 0x66)
                      || b == UInt8(ascii: ".") || b == UInt8(ascii: ":") || b == UInt8(ascii: "%") })
            else { return nil }
            return String(decoding: host, as: UTF8.self)
        }
        return nil
    }
}

/// The caller's account, from its kernel-verified uid (never from a name the client sends).
public struct CallerAccount: Sendable, Equatable {
    public var uid: UInt32
    public var gid: UInt32
    public var name: String
    public var home: String

    /// getpwuid_r; nil when the uid has no passwd entry.
    public static func lookup(uid: UInt32) -> CallerAccount? {
        var pw = passwd()
        var result: UnsafeMutablePointer<passwd>? = nil
        var size = 1024
        while size <= 1 << 20 {
            var buf = [CChar](repeating: 0, count: size)
            let rc = getpwuid_r(uid, &pw, &buf, size, &result)
            if rc == ERANGE { size *= 4; continue }
            guard rc == 0, let entry = result, let name = entry.pointee.pw_name else { return nil }
            let home = entry.pointee.pw_dir.map { String(cString: $0) } ?? "/"
            return CallerAccount(uid: entry.pointee.pw_uid, gid: entry.pointee.pw_gid, name: String(cString: name), home: home)
        }
        return nil
    }
}

/// The fields of `/proc/PID/stat` the broker uses. `comm` (field 2) may contain spaces and
/// parentheses, so fields are counted after the last `)`.
struct ProcStat: Equatable {
    var pid: Int32
    var state: UInt8
    var ppid: Int32
    var pgrp: Int32
    var session: Int32
    var ttyNr: Int32
    var startTime: UInt64

    /// The main thread's stat, which carries the same process-wide fields (ppid, session,
    /// tty, the process's start time) as /proc/PID/stat; that file also sums CPU time and faults
    /// over every thread, work that grows with the caller's thread count on each request.
    static func read(pid: Int32) -> ProcStat? {
        guard let bytes = ProcFile.read("/proc/\(pid)/task/\(pid)/stat", limit: 4096) else { return nil }
        return parse(bytes, pid: pid)
    }

    /// Fields after the last `)` (the command name before it is the process's own choice),
    /// by position: field 3 (state) … field 22 (starttime). Read in place, without splitting
    /// into strings, since it runs for every request; numbers are plain decimal as the kernel
    /// writes them (an optional `-`, then digits), anything else refuses the whole line.
    static func parse(_ bytes: [UInt8], pid: Int32) -> ProcStat? {
        guard let close = bytes.lastIndex(of: UInt8(ascii: ")")) else { return nil }
        var state: UInt8?
        var numbers: (ppid: Int64?, pgrp: Int64?, session: Int64?, tty: Int64?) = (nil, nil, nil, nil)
        var startTime: UInt64?
        var field = 0
        var i = close + 1
        while i < bytes.count, field <= 19 {
            guard bytes[i] != UInt8(ascii: " ") else { i += 1; continue }
            var end = i
            while end < bytes.count, bytes[end] != UInt8(ascii: " ") { end += 1 }
            let token = bytes[i..<end]
            switch field {
            case 0:
                guard token.count == 1 else { return nil }
                state = token.first
            case 1: numbers.ppid = decimal(token)
            case 2: numbers.pgrp = decimal(token)
            case 3: numbers.session = decimal(token)
            case 4: numbers.tty = decimal(token)
            case 19:
                guard let t = decimal(token.prefix(while: { $0 != 0x0A })), t >= 0 else { return nil }
                startTime = UInt64(t)
            default: break
            }
            field += 1
            i = end
        }
        guard let state, let startTime,
              let ppid = numbers.ppid.flatMap(Int32.init(exactly:)), let pgrp = numbers.pgrp.flatMap(Int32.init(exactly:)),
              let session = numbers.session.flatMap(Int32.init(exactly:)), let tty = numbers.tty.flatMap(Int32.init(exactly:))
        else { return nil }
        return ProcStat(pid: pid, state: state, ppid: ppid, pgrp: pgrp, session: session, ttyNr: tty, startTime: startTime)
    }

    /// `-`? digits, at most 18 of them (within Int64); nil for anything else.
    static func decimal(_ token: ArraySlice<UInt8>) -> Int64? {
        var digits = token[...]
        let negative = digits.first == UInt8(ascii: "-")
        if negative { digits = digits.dropFirst() }
        guard !digits.isEmpty, digits.count <= 18 else { return nil }
        var value: Int64 = 0
        for d in digits {
            guard d >= UInt8(ascii: "0"), d <= UInt8(ascii: "9") else { return nil }
            value = value * 10 + Int64(d - UInt8(ascii: "0"))
        }
        return negative ? -value : value
    }
}

/// Small bounded reads of /proc files without Foundation.
enum ProcFile {
    static func read(_ path: String, limit: Int) -> [UInt8]? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var out: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        while out.count < limit {
            let n = chunk.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress!, $0.count) }
            if n > 0 { out += chunk[0..<n]; continue }
            if n < 0 && errno == EINTR { continue }
            if n < 0 { return nil }
            break
        }
        return out.count > limit ? Array(out[0..<limit]) : out
    }

    /// Numeric entries of /proc.
    static func pids() -> [Int32] {
        guard let dir = opendir("/proc") else { return [] }
        defer { closedir(dir) }
        var pids: [Int32] = []
        while let e = readdir(dir) {
            let name = withUnsafeBytes(of: e.pointee.d_name) { raw in
                String(decoding: raw.prefix(while: { $0 != 0 }), as: UTF8.self)
            }
            if let p = Int32(name) { pids.append(p) }
        }
        return pids
    }
}
