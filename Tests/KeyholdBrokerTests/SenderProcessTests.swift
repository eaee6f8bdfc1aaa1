import Foundation
import Glibc
import Testing
import CKeyholdOS
import KeyholdAuth
@testable import KeyholdProtocol
@testable import KeyholdBroker

/// A request's sender is identified on arrival by its executable only; its session, terminal
/// and start time are read when a reuse window or PAM first asks. These tests show that what
/// is read late is still the sender's: read while it runs, it matches what /proc said of it;
/// once it has exited (a zombie, whose /proc entry still reads), it is unknown, so it has no
/// reuse window and counts as remote.
@Suite struct SenderProcessTests {
    /// `/bin/sleep` in a session of its own (setsid execs it without forking: the spawned
    /// child is not a group leader), not reaped until `reap`.
    final class Sleeper {
        let pid: Int32
        init() throws {
            var pid: pid_t = 0
            let argv: [UnsafeMutablePointer<CChar>?] = [strdup("/usr/bin/setsid"), strdup("/bin/sleep"), strdup("30"), nil]
            defer { for a in argv { free(a) } }
            guard posix_spawn(&pid, "/usr/bin/setsid", nil, nil, argv, environ) == 0 else { throw POSIXError(.ECHILD) }
            self.pid = pid
            // Until setsid has exec'd sleep, the child is still the spawning image.
            for _ in 0..<5000 where CallerFacts.readExecutable(pid: pid) != "/usr/bin/sleep" { usleep(2_000) }
        }
        /// Killed and left a zombie: /proc still shows its stat line, its pidfd says it exited.
        func killLeavingAZombie() {
            kill(pid, SIGKILL)
            var info = siginfo_t()
            _ = waitid(P_PID, id_t(pid), &info, WEXITED | WNOWAIT)
        }
        func reap() {
            kill(pid, SIGKILL)
            var status: Int32 = 0
            _ = waitpid(pid, &status, 0)
        }
        deinit { reap() }
    }

    static func caller(sentBy pid: Int32) -> Caller {
        // The connection's pidfd, as SO_PEERPIDFD would give it for this process.
        let peer = Peer(pid: pid, uid: getuid(), pidfd: ckh_pidfd_open(pid))
        defer { peer.close() }
        return Caller.identify(socket: -1, peer: peer, senders: [FrameSender(pid: pid, uid: getuid(), gid: getgid())])
    }

    @Test func factsReadLateAreTheSendersOwn() throws {
        let sleeper = try Sleeper()
        #expect(CallerFacts.readExecutable(pid: sleeper.pid) == "/usr/bin/sleep")
        let caller = Self.caller(sentBy: sleeper.pid)
        #expect(caller.identityProblem == nil)
        #expect(caller.executable == "/usr/bin/sleep")
        let now = try #require(CallerFacts.read(pid: sleeper.pid))
        #expect(caller.sessionID == sleeper.pid, "setsid made it a session leader")
        #expect(caller.sessionID == now.sessionID)
        #expect(caller.startTime == now.startTime && caller.startTime > 0)
        #expect(caller.tty == nil)
        #expect(caller.reuseScope == .session(sleeper.pid))
    }

    @Test func aSenderThatExitsBeforeItsFactsAreReadHasNone() throws {
        let sleeper = try Sleeper()
        let caller = Self.caller(sentBy: sleeper.pid)
        #expect(caller.identityProblem == nil, "alive when its request was identified")
        sleeper.killLeavingAZombie()
        // The zombie's stat line still reads (with its session), so only the pidfd tells.
        #expect(CallerFacts.readLocal(pid: sleeper.pid)?.sessionID == sleeper.pid)
        #expect(caller.sessionID == -1)
        #expect(caller.startTime == 0)
        #expect(caller.reuseScope == nil, "no reuse window for a process that has gone")
        #expect(caller.remoteHost == "remote", "PAM is told remote, which only restricts")
    }

    @Test func factsReadOnceStayWhatWasRead() throws {
        let sleeper = try Sleeper()
        let caller = Self.caller(sentBy: sleeper.pid)
        let session = caller.sessionID
        #expect(session == sleeper.pid)
        sleeper.killLeavingAZombie()
        // Read before it exited: the reuse decision and the PAM request of this one request
        // see the same facts.
        #expect(caller.sessionID == session)
        #expect(caller.sentBy(uid: getuid() + 1).sessionID == session, "the refused sender's entry names the same process")
    }

    @Test func aSenderGoneOnArrivalIsFlaggedAndHasNoFacts() throws {
        let sleeper = try Sleeper()
        sleeper.killLeavingAZombie()
        let caller = Self.caller(sentBy: sleeper.pid)
        #expect(caller.identityProblem == "the sender exited before it could be identified")
        #expect(caller.sessionID == -1)
        #expect(caller.reuseScope == nil)
        #expect(caller.remoteHost == nil, "nothing could be read: local, as before")
    }
}
