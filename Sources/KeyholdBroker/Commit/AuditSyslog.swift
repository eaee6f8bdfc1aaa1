import Glibc
import Synchronization
import CKeyholdOS
import KeyholdCore
import KeyholdVault

/// A copy of every committed audit entry, one line each, to the system log (facility
/// authpriv), so journald or rsyslog keep a record outside the vault database.
///
/// Written as a syslog client of its own (a datagram to /dev/log, as glibc's syslog(3) does)
/// so tests can point it at a socket they read. The line names the item by id, never by
/// service or account, and carries no reason text: the system log is read by more people
/// than the vault's owner. If the log socket is missing, the copy is skipped: the database
/// entry, committed first, is the record that gates a release.
///
/// The socket is connected once, not addressed per line (a path lookup in the kernel on every
/// entry). A receiver that went away (a restarted daemon binds a new socket at the path) is
/// connected to again at once and the line sent again; a path with no receiver is tried again
/// at most once a second, lines meanwhile being skipped as they were while it was missing.
final class AuditSyslog: Sendable {
    let socketPath: String
    /// Always this descriptor number: a reconnection replaces the socket behind it (`dup3`),
    /// so a thread sending meanwhile uses the old socket or the new one, never a reused number.
    private let fd: Int32
    /// CLOCK_MONOTONIC milliseconds before which no reconnection is tried (0: try now).
    private let nextAttempt = Atomic<Int64>(0)
    /// Whether `fd` was last seen connected: while not, a line costs no send that must fail.
    private let connected = Atomic<Bool>(false)

    /// authpriv (10) << 3 | info (6)
    static let priority = 86
    static let retryMilliseconds: Int64 = 1_000

    init(socketPath: String = "/dev/log") {
        self.socketPath = socketPath
        fd = Self.newSocket()
        _ = reconnect()
    }

    deinit { close(fd) }

    private static func newSocket() -> Int32 {
        socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
    }

    func line(for r: AuditRecord) -> String {
        var text = "audit op=\(r.operation.rawValue) decision=\(r.decision.rawValue) outcome=\(r.outcome.name) method=\(r.method)"
        text += " item=\(r.itemID?.description ?? "-") uid=\(r.callerUID) pid=\(r.callerPID) exe=\(Printable.escape(r.executable, escapingSpaces: true))"
        return text
    }

    func record(_ r: AuditRecord) {
        guard ready() else { return }
        deliver(line(for: r))
    }

    func send(_ message: String) {
        guard ready() else { return }
        deliver(message)
    }

    /// Connected, or connected now: with no receiver, a line is not even formatted.
    private func ready() -> Bool { connected.load(ordering: .relaxed) || reconnect() }

    private func deliver(_ message: String) {
        var t = time_t(0)
        time(&t)
        var tm = tm()
        localtime_r(&t, &tm)
        var stamp = [UInt8](repeating: 0, count: 32)
        let n = stamp.withUnsafeMutableBufferPointer { strftime($0.baseAddress!, 32, "%b %e %H:%M:%S", &tm) }
        let datagram = Array("<\(Self.priority)>\(String(decoding: stamp[0..<n], as: UTF8.self)) keyholdd[\(getpid())]: \(message)".utf8)
        let sent = sendConnected(datagram)
        // A full receiver drops the line (never wait on the log); anything else means no
        // receiver on this socket: connect again and send once more.
        guard sent != 0, sent != EAGAIN, sent != EWOULDBLOCK, sent != ENOBUFS, reconnect() else { return }
        _ = sendConnected(datagram)
    }

    /// 0, or the errno of the failed send.
    private func sendConnected(_ datagram: [UInt8]) -> Int32 {
        datagram.withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT | MSG_NOSIGNAL)) } >= 0 ? 0 : errno
    }

    /// Connects a fresh socket to the path and puts it behind `fd`; false (and no new try for
    /// a second) when nothing receives there.
    private func reconnect() -> Bool {
        let now = MonotonicClock.milliseconds()
        guard now >= nextAttempt.load(ordering: .relaxed) else { return false }
        let fresh = Self.newSocket()
        defer { if fresh >= 0 { close(fresh) } }
        guard fresh >= 0, ckh_connect_unix(fresh, socketPath) == 0, ckh_replace_fd(fresh, fd) == fd else {
            connected.store(false, ordering: .relaxed)
            nextAttempt.store(now + Self.retryMilliseconds, ordering: .relaxed)
            return false
        }
        nextAttempt.store(0, ordering: .relaxed)
        connected.store(true, ordering: .relaxed)
        return true
    }
}
