import Glibc
import CKeyholdOS
import KeyholdAuth

/// Who is calling, as the kernel says: `SO_PEERCRED` uid and pid, then what /proc shows for
/// that pid (`CallerFacts`). Nothing here comes from what the client sent.
struct Caller: Sendable {
    let uid: UInt32
    let pid: Int32
    /// `/proc/PID/exe`, or "?" when it cannot be read (the process is gone).
    let executable: String
    /// Login session (`getsid`), which scopes authentication reuse windows; -1 if unknown.
    let sessionID: Int32
    /// passwd name of `uid`; nil when the uid has no passwd entry (no PAM possible).
    let userName: String?
    /// PAM_TTY and PAM_RHOST, from what the broker could verify about the caller's session.
    let tty: String?
    let remoteHost: String?

    /// Reads the peer's credentials. A socket whose peer cannot be identified is refused.
    static func identify(socket fd: Int32) -> Caller? {
        var pid: Int32 = 0, uid: UInt32 = 0, gid: UInt32 = 0
        guard ckh_peercred(fd, &pid, &uid, &gid) == 0, pid > 0 else { return nil }
        let facts = CallerFacts.read(pid: pid)
        return Caller(uid: uid, pid: pid, executable: facts?.executable ?? "?", sessionID: facts?.sessionID ?? -1,
                      userName: CallerAccount.lookup(uid: uid)?.name, tty: facts?.tty, remoteHost: facts?.pamRemoteHost)
    }
}
