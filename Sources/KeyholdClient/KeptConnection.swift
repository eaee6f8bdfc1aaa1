import Glibc
import Synchronization
import KeyholdCore
import KeyholdProtocol
import CKeyholdOS

/// The one connection a `Vault` keeps between requests, so that a program asking often does
/// not pay a connect, an accept and a thread hand-off in the broker per request. The broker
/// still identifies the sender of every request anew (`SCM_CREDENTIALS` and /proc), so a kept
/// connection carries no authority of its own.
///
/// A kept connection is used again only by the process that opened it (after a `fork` the
/// child closes its inherited copy and connects itself: two processes on one connection would
/// interleave frames, and the broker refuses `--allow-exe` items on a shared connection), only
/// while the process has the same user and group ids (a daemon that dropped privileges
/// connects as what it is now), only within `reuseMilliseconds` of its last answer (the broker
/// waits 1 s for a next request, holding one of the uid's connection slots), and only when
/// nothing is pending on it (the broker closed it, or sent something unexpected).
final class KeptConnection: Sendable {
    static let reuseMilliseconds: UInt64 = 500

    /// The process a connection was kept by, and the ids it ran with.
    struct Owner: Equatable {
        let pid: Int32, uid: UInt32, euid: UInt32, savedUID: UInt32, gid: UInt32, egid: UInt32, savedGID: UInt32

        /// Three system calls (asked before every request on a kept connection), not five.
        static var current: Owner {
            // Cannot fail for the calling process; should it, ids of -1 (which no process has)
            // differ from the kept connection's owner's, and the request connects anew.
            var ids = [UInt32](repeating: .max, count: 6)
            if ckh_process_ids(&ids) != 0 { ids = [UInt32](repeating: .max, count: 6) }
            return Owner(pid: getpid(), uid: ids[0], euid: ids[1], savedUID: ids[2], gid: ids[3], egid: ids[4], savedGID: ids[5])
        }
    }

    private struct Idle: @unchecked Sendable {
        var connection: BrokerConnection?
        var lastAnswer: UInt64 = 0
    }
    private let idle = Mutex(Idle())

    /// The kept connection when it may be used again, else nil (and a stale one is closed).
    func take() -> BrokerConnection? {
        guard let kept = idle.withLock({ i -> Idle? in
            defer { i = Idle() }
            return i.connection == nil ? nil : i
        }), let connection = kept.connection else { return nil }
        let now = Owner.current
        if connection.owner.pid != now.pid {
            // A forked child: its copy of the parent's descriptor is closed (the parent's stays
            // open), unless the number now names another file the child opened since.
            if Self.inode(connection.fd) == connection.inode { connection.close() }
            return nil
        }
        let fresh = MonotonicClock.nanoseconds() - kept.lastAnswer < Self.reuseMilliseconds * 1_000_000
        // The ids it was opened with, not those at its last answer: a process that changed ids
        // while a request was in flight connects again as what it is now.
        // poll: readable or hung up means the broker closed it (or spoke out of turn).
        guard connection.owner == now, fresh, ckh_poll1(connection.fd, Int32(POLLIN), 0) == 0 else {
            connection.close()
            return nil
        }
        return connection
    }

    /// Keeps `connection` after a complete answer; the one kept before (another thread's) is closed.
    func keep(_ connection: BrokerConnection) {
        let kept = Idle(connection: connection, lastAnswer: MonotonicClock.nanoseconds())
        let previous = idle.withLock { i -> BrokerConnection? in
            defer { i = kept }
            return i.connection
        }
        previous?.close()
    }

    static func inode(_ fd: Int32) -> UInt64 {
        var st = stat()
        return fstat(fd, &st) == 0 ? UInt64(st.st_ino) : 0
    }

    deinit { idle.withLock { $0.connection?.close() } }
}
