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
/// within `reuseSeconds` of its last answer (the broker waits 5 s for a next request), and only
/// when nothing is pending on it (the broker closed it, or sent something unexpected).
final class KeptConnection: Sendable {
    static let reuseSeconds: UInt64 = 2

    private struct Idle: @unchecked Sendable {
        var connection: BrokerConnection?
        var owner: Int32 = 0
        var lastAnswer: UInt64 = 0
    }
    private let idle = Mutex(Idle())

    /// The kept connection when it may be used again, else nil (and a stale one is closed).
    func take() -> BrokerConnection? {
        guard let (connection, owner, lastAnswer) = idle.withLock({ i -> (BrokerConnection, Int32, UInt64)? in
            defer { i.connection = nil }
            return i.connection.map { ($0, i.owner, i.lastAnswer) }
        }) else { return nil }
        let fresh = MonotonicClock.nanoseconds() - lastAnswer < Self.reuseSeconds * 1_000_000_000
        // poll: readable or hung up means the broker closed it (or spoke out of turn).
        guard owner == getpid(), fresh, ckh_poll1(connection.fd, Int32(POLLIN), 0) == 0 else {
            connection.close()
            return nil
        }
        return connection
    }

    /// Keeps `connection` after a complete answer; the one kept before (another thread's) is closed.
    func keep(_ connection: BrokerConnection) {
        let previous = idle.withLock { i -> BrokerConnection? in
            defer { i = Idle(connection: connection, owner: getpid(), lastAnswer: MonotonicClock.nanoseconds()) }
            return i.connection
        }
        previous?.close()
    }

    deinit { idle.withLock { $0.connection?.close() } }
}
