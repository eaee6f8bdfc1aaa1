import Glibc
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
final class AuditSyslog: Sendable {
    let socketPath: String
    private let fd: Int32

    /// authpriv (10) << 3 | info (6)
    static let priority = 86

    init(socketPath: String = "/dev/log") {
        self.socketPath = socketPath
        fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
    }

    deinit { close(fd) }

    func line(for r: AuditRecord) -> String {
        var text = "audit op=\(r.operation.rawValue) decision=\(r.decision.rawValue) outcome=\(r.outcome.name) method=\(r.method)"
        text += " item=\(r.itemID?.description ?? "-") uid=\(r.callerUID) pid=\(r.callerPID) exe=\(Printable.escape(r.executable, escapingSpaces: true))"
        return text
    }

    func record(_ r: AuditRecord) {
        send(line(for: r))
    }

    func send(_ message: String) {
        var t = time_t(0)
        time(&t)
        var tm = tm()
        localtime_r(&t, &tm)
        var stamp = [UInt8](repeating: 0, count: 32)
        let n = stamp.withUnsafeMutableBufferPointer { strftime($0.baseAddress!, 32, "%b %e %H:%M:%S", &tm) }
        let datagram = "<\(Self.priority)>\(String(decoding: stamp[0..<n], as: UTF8.self)) keyholdd[\(getpid())]: \(message)"
        let bytes = Array(datagram.utf8)
        _ = bytes.withUnsafeBytes { ckh_sendto_unix(fd, $0.baseAddress, UInt($0.count), Int32(MSG_DONTWAIT | MSG_NOSIGNAL), socketPath) }
    }
}
