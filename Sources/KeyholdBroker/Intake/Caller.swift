// Who is calling. Each rule is held by the test named after it.
//
//  1. The caller MUST be the process the kernel names as the sender of the request's bytes
//     (`SCM_CREDENTIALS`, `SCM_PIDFD`), read anew for each request, never a value the client
//     wrote. (HostileLocalUserTests.relayedAndPassedConnectionsAreRefusedAndAuditedWithTheRealSender)
//  2. A request whose bytes came from another uid than the one that connected MUST be refused
//     and audited under the sender. (HostileLocalUserTests.requestSentByAnotherUserOnRootsConnectionIsRefused,
//     ConnectionIdsTests.aProcessWhoseRealAndEffectiveUidsDifferIsRefused)
//  3. A sender that exited (its pid free for another process) MUST NOT be named as whatever
//     took its pid. (PIDReuseTests.aSenderWhosePIDAnotherProgramTakesIsNotNamedAsThatProgram,
//     SenderProcessTests.aSenderThatExitsBeforeItsFactsAreReadHasNone)
//  4. Facts read on demand MUST be the sender's own, read once. (SenderProcessTests.factsReadLateAreTheSendersOwn,
//     SenderProcessTests.factsReadOnceStayWhatWasRead)
//  5. A claim relayed by the Secret Service agent MUST only be recorded, never trusted.
//     (SecretServiceClaimTests)

import Glibc
import Synchronization
import CKeyholdOS
import KeyholdAuth
import KeyholdProtocol

/// The process at the other end of a connection, as the kernel said at connect time
/// (`SO_PEERCRED`), with a pidfd that tells whether that very process is still alive.
struct Peer: Sendable {
    let pid: Int32
    let uid: UInt32
    /// `SO_PEERPIDFD`, or `pidfd_open` of the peer pid where the kernel lacks that option; -1
    /// if neither.
    let pidfd: Int32

    init(fd: Int32, pid: Int32, uid: UInt32) {
        let fromSocket = ckh_peer_pidfd(fd)
        // Only a kernel without the option is asked by pid number. Where the option exists but
        // gives no pidfd (a kernel that cannot name a peer already reaped), the number may name
        // another process by now (PIDReuseTests): the peer then counts as gone.
        let pidfd: Int32
        if fromSocket >= 0 { pidfd = fromSocket }
        else if fromSocket == -ENOPROTOOPT { pidfd = ckh_pidfd_open(pid) }
        else { pidfd = -1 }
        self.init(pid: pid, uid: uid, pidfd: pidfd)
    }

    /// A peer whose pidfd is already known (-1: none).
    init(pid: Int32, uid: UInt32, pidfd: Int32) {
        self.pid = pid
        self.uid = uid
        self.pidfd = pidfd
    }

    var isAlive: Bool { pidfd >= 0 && ckh_pidfd_alive(pidfd) == 1 }

    func close() { if pidfd >= 0 { _ = Glibc.close(pidfd) } }
}

/// Who is calling, as the kernel says: the process that sent the request (`SCM_CREDENTIALS`
/// of its bytes, at the time it sent them), then what /proc shows for that pid
/// (`CallerFacts`). Nothing here comes from what the client wrote.
struct Caller: Sendable {
    let uid: UInt32
    /// The sender of the request (the connection's peer when no credentials came).
    let pid: Int32
    /// `/proc/PID/exe` of the sender, read after its request arrived; "?" when unreadable, or
    /// when the sender had exited by the time it was read (the pid may name another process).
    let executable: String
    /// What only a gated release needs (session, terminal, start time, account name, remote
    /// host), read when first asked for: a `policy none` get reads none of it.
    private let onDemand: CallerOnDemand
    /// Login session (`getsid`), which scopes authentication reuse windows; -1 if unknown.
    var sessionID: Int32 { onDemand.process.facts?.sessionID ?? -1 }
    /// Start time of the sender (clock ticks after boot); with `pid`, one process. 0 if unknown.
    var startTime: UInt64 { onDemand.process.facts?.startTime ?? 0 }
    /// PAM_TTY, from what the broker could verify about the caller's session.
    var tty: String? { onDemand.process.facts?.tty }
    /// passwd name of `uid`; nil when the uid has no passwd entry (no PAM possible).
    var userName: String? { onDemand.userName }
    /// nil for a local caller; "remote" when the sender's ancestry can no longer be read.
    var remoteHost: String? { onDemand.process.remoteHost }
    /// The connection this request came on, and its peer.
    var socket: Int32 = -1
    var peer: Peer?
    /// Why the sender cannot be tied to one process that connected, sent and still runs
    /// (checked again in `executableForAllowList`); nil when nothing was found wrong yet.
    var identityProblem: String?

    /// The caller of a request whose bytes came from `senders` over `peer`'s connection.
    static func identify(socket fd: Int32, peer: Peer, senders: [FrameSender]) -> Caller {
        var problem: String?
        var pid = peer.pid
        var sent: FrameSender.Handle = .notSent
        if senders.count != 1 {
            problem = senders.isEmpty ? "the request came without sender credentials" : "the request was sent by more than one process"
        } else if senders[0].pid <= 0 {
            problem = "the request came without sender credentials"
        } else {
            pid = senders[0].pid
            sent = senders[0].handle
        }
        // A pidfd of the sender (the kernel's, else taken now) held while /proc is read: if it is
        // still alive afterwards, the executable is this process's; if not, the pid may name
        // another process by then, so it is unknown.
        let process = SenderProcess(pid: pid, sent: sent, connectorPIDFD: pid == peer.pid ? peer.pidfd : nil)
        var executable = CallerFacts.readExecutable(pid: pid)
        if !process.confirmArrival() {
            problem = problem ?? "the sender exited before it could be identified"
            executable = nil
        }
        var caller = Caller(uid: peer.uid, pid: pid, executable: executable ?? "?",
                            onDemand: CallerOnDemand(uid: peer.uid, process: process))
        caller.socket = fd
        caller.peer = peer
        caller.identityProblem = problem
        return caller
    }

    /// The same process under the uid that sent its request (SCM_CREDENTIALS): the entry of a
    /// request refused because another user than the one that connected sent it names that
    /// user, as it already names that process and executable.
    func sentBy(uid sender: UInt32) -> Caller {
        var c = Caller(uid: sender, pid: pid, executable: executable, onDemand: CallerOnDemand(uid: sender, process: onDemand.process))
        c.socket = socket
        c.peer = peer
        c.identityProblem = identityProblem
        return c
    }

    /// The peer alone, for a connection whose request could not be read.
    static func identify(socket fd: Int32, peer: Peer) -> Caller {
        let process = SenderProcess(pid: peer.pid, connectorPIDFD: peer.pidfd)
        let read = CallerFacts.readExecutable(pid: peer.pid)
        let executable = process.confirmArrival() ? read : nil
        var caller = Caller(uid: peer.uid, pid: peer.pid, executable: executable ?? "?",
                            onDemand: CallerOnDemand(uid: peer.uid, process: process))
        caller.socket = fd
        caller.peer = peer
        caller.identityProblem = "the request could not be read"
        return caller
    }

    /// The executable an `--allow-exe` list is checked against, or why there is none: the
    /// process that connected must be the one that sent the request, be the only process
    /// holding the connection, still be alive, and still run the executable read on arrival.
    /// 20 × 5 ms: how long a second holder of the connection is waited for before refusing.
    static let sharedHolderWaits = 20

    func executableForAllowList() -> Result<String, IdentityProblem> {
        if let identityProblem { return .failure(IdentityProblem(why: identityProblem)) }
        guard let peer, peer.pid == pid else { return .failure(IdentityProblem(why: "the request was sent by another process than the one that connected")) }
        guard peer.isAlive else { return .failure(IdentityProblem(why: "the process that connected has exited")) }
        var inode: UInt64 = 0
        guard ckh_unix_peer_inode(socket, &inode) == 0 else { return .failure(IdentityProblem(why: "the connection's holders cannot be checked")) }
        var holders = [Int32](repeating: 0, count: 4)
        var n = ckh_socket_holders(inode, &holders, Int32(holders.count))
        // A program that spawns children while it asks shares the connection with each child
        // between its clone and its exec (close-on-exec ends it): wait that out, 100 ms at most.
        // What is decided still needs exactly one holder, at the moment it is decided.
        for _ in 0..<Self.sharedHolderWaits where n > 1 {
            usleep(5_000)
            n = ckh_socket_holders(inode, &holders, Int32(holders.count))
        }
        guard n == 1, holders[0] == pid else {
            return .failure(IdentityProblem(why: n < 0 ? "the connection's holders cannot be checked" : "the connection is held by \(n) processes"))
        }
        guard CallerFacts.readExecutable(pid: pid) == executable, peer.isAlive else {
            return .failure(IdentityProblem(why: "the caller changed its executable"))
        }
        return .success(executable)
    }
}

/// The caller's account name, read once on first use (only PAM and biometry need it), and
/// the sending process's facts beyond its executable.
final class CallerOnDemand: Sendable {
    private let uid: UInt32
    let process: SenderProcess
    private let userNameRead = Mutex<String??>(nil)

    init(uid: UInt32, process: SenderProcess) {
        self.uid = uid
        self.process = process
    }

    var userName: String? {
        if let known = userNameRead.withLock({ $0 }) { return known }
        let name = CallerAccount.lookup(uid: uid)?.name
        userNameRead.withLock { $0 = .some(name) }
        return name
    }
}

/// What a reuse window belongs to: the caller's login session; or, when the kernel shows the
/// caller no session (0: the session's leader is outside the caller's PID namespace, as in a
/// container), that one process (pid and start time), so that a long-running caller such as
/// the Secret Service agent still has a window and no other process shares it.
enum ReuseScope: Hashable, Sendable {
    case session(Int32)
    /// With the executable read on arrival: a process that execs another program keeps its pid
    /// and start time, and must not pass its window on to that program.
    case process(pid: Int32, startTime: UInt64, executable: String)
}

extension Caller {
    /// nil when the caller cannot be scoped (facts unreadable): no window at all. A process
    /// window needs the request tied to that one process: sent by it alone, on the connection
    /// it made (else a process holding another's connection would use its window).
    var reuseScope: ReuseScope? {
        if sessionID > 0 { return .session(sessionID) }
        guard sessionID == 0, pid > 0, startTime > 0, identityProblem == nil, peer?.pid == pid else { return nil }
        guard executable != "?" else { return nil }
        return .process(pid: pid, startTime: startTime, executable: executable)
    }
}

/// Why a request cannot be tied to one process for an `--allow-exe` check.
struct IdentityProblem: Error {
    let why: String
}

extension Caller {
    /// A caller whose facts are already known (the release gate's unit tests).
    init(uid: UInt32, pid: Int32, executable: String, sessionID: Int32, startTime: UInt64 = 0, userName: String?,
         tty: String?, remoteHost: String?) {
        let facts = SenderProcess.Facts(sessionID: sessionID, startTime: startTime, tty: tty)
        let process = SenderProcess(pid: pid, known: sessionID < 0 ? nil : facts, remoteHost: remoteHost)
        self.init(uid: uid, pid: pid, executable: executable, onDemand: CallerOnDemand(uid: uid, knownUserName: userName, process: process))
    }
}

extension CallerOnDemand {
    convenience init(uid: UInt32, knownUserName: String?, process: SenderProcess) {
        self.init(uid: uid, process: process)
        userNameRead.withLock { $0 = .some(knownUserName) }
    }
}
