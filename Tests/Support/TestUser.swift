import Foundation
import Glibc
import Synchronization

/// A throwaway unprivileged account, removed again on deinit.
public final class TestUser: @unchecked Sendable {
    public let name: String
    public let uid: UInt32

    /// Names are unique within this test process (a counter), and across processes by pid;
    /// a name left behind by a killed run is skipped.
    private static let next = Mutex(0)

    public init(prefix: String = "khu") throws {
        var made: (String, UInt32)?
        var lastError = ""
        for _ in 0..<20 where made == nil {
            let n = Self.next.withLock { $0 += 1; return $0 }
            let candidate = "\(prefix)\(getpid() % 100000)x\(n)"
            let r = runCommand("/usr/sbin/useradd", ["-M", "-s", "/usr/sbin/nologin", candidate])
            if r.status == 0, let pw = getpwnam(candidate) {
                made = (candidate, pw.pointee.pw_uid)
            } else {
                lastError = r.stderr
                usleep(50_000)  // another test's useradd may hold /etc/passwd's lock
            }
        }
        guard let made else { throw FixtureError.brokerDidNotStart("useradd failed: \(lastError)") }
        (name, uid) = made
    }

    deinit { runCommand("/usr/sbin/userdel", [name]) }
}
