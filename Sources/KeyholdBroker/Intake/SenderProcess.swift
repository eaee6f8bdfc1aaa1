import Glibc
import Synchronization
import CKeyholdOS
import KeyholdAuth
import KeyholdProtocol

/// The process that sent a request, and what `/proc/PID/stat` says of it (session, terminal,
/// start time) and its sshd ancestry, each read when first asked for: only a reuse window or
/// PAM needs them, so a `policy none` get does not pay for the stat read.
/// A pidfd taken on arrival, before the executable was read, is kept until the request is done:
/// facts read later are that same process's while it is alive, and unknown once it has exited
/// (no session: no reuse window; no terminal), which only restricts it.
final class SenderProcess: Sendable {
    /// What the stat line gave; `read` is kept for the sshd walk, which compares its start time.
    struct Facts: Sendable {
        var sessionID: Int32
        var startTime: UInt64
        var tty: String?
        fileprivate var read: CallerFacts?

        init(sessionID: Int32, startTime: UInt64, tty: String?) {
            self.sessionID = sessionID
            self.startTime = startTime
            self.tty = tty
        }

        fileprivate init(_ read: CallerFacts) {
            self.init(sessionID: read.sessionID, startTime: read.startTime, tty: read.tty)
            self.read = read
        }
    }
    private struct State { var facts: Facts??; var remoteHost: String?? }
    let pid: Int32
    /// The sender's pidfd, whoever opened it (closed with the last holder); nil when none could
    /// be had, or for facts given (the gate's unit tests).
    private let handle: SenderPIDFD?
    private let state: Mutex<State>

    /// `sent`: what the kernel sent with the request (`SCM_PIDFD`): its pidfd names the process
    /// that sent, also when it has exited and another took its pid (PIDReuseTests); *gone*: it
    /// had exited, so its facts are unknown. Where the kernel sends none (before Linux 6.5):
    /// `connectorPIDFD`, the connection's own pidfd (`Peer`, -1 when it has none), given when the
    /// sender's pid number is the connector's, which is the kernel's answer for the process that
    /// connected; otherwise a `pidfd_open` of the number, which could name another process that
    /// took it after the sender exited (SECURITY.md, "PID reuse").
    init(pid: Int32, sent: FrameSender.Handle = .notSent, connectorPIDFD: Int32? = nil) {
        self.pid = pid
        switch sent {
        case .open(let received): handle = received
        case .gone: handle = nil
        case .notSent:
            let opened = connectorPIDFD.map { $0 >= 0 ? ckh_dup_cloexec($0) : -1 } ?? ckh_pidfd_open(pid)
            handle = opened >= 0 ? SenderPIDFD(owning: opened) : nil
        }
        state = Mutex(State())
    }

    /// Facts already known (the release gate's unit tests).
    init(pid: Int32, known facts: Facts?, remoteHost: String?) {
        self.pid = pid
        handle = nil
        state = Mutex(State(facts: .some(facts), remoteHost: .some(remoteHost)))
    }

    private var isAlive: Bool { handle.map { ckh_pidfd_alive($0.fd) == 1 } ?? false }

    /// Whether the sender was still alive once its executable was read. If not, its facts are
    /// unknown and it counts as local (what PAM is told when nothing about it could be read).
    func confirmArrival() -> Bool {
        guard isAlive else {
            state.withLock { $0 = State(facts: .some(nil), remoteHost: .some(nil)) }
            return false
        }
        return true
    }

    /// Read once; nil when the process has exited (or /proc cannot be read).
    var facts: Facts? {
        if let known = state.withLock({ $0.facts }) { return known }
        let read = CallerFacts.readLocal(pid: pid)
        let facts = isAlive ? read.map(Facts.init) : nil
        state.withLock { $0.facts = .some(facts) }
        return facts
    }

    /// PAM_RHOST, read once. The sshd walk checks that the pid still names the process read
    /// (its start time); otherwise, or when the process has gone, it is "remote".
    var remoteHost: String? {
        if let known = state.withLock({ $0.remoteHost }) { return known }
        let host = facts.map { f in f.read.flatMap { CallerFacts.remoteSession(of: $0)?.host } } ?? "remote"
        state.withLock { $0.remoteHost = .some(host) }
        return host
    }
}
