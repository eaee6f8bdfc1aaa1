import Glibc
import CKeyholdOS
import KeyholdCore
import KeyholdProtocol

enum ListenerError: Error, CustomStringConvertible {
    case pathTooLong, inUse, notASocket, system(String, Int32)
    var description: String {
        switch self {
        case .pathTooLong: "socket path too long"
        case .inUse: "another broker is listening there"
        case .notASocket: "a file that is not a socket is in the way"
        case .system(let call, let e): "\(call): \(String(cString: strerror(e)))"
        }
    }
}

/// The Unix socket and its accept loop: one thread per connection, so a slow PAM conversation
/// holds up no one else; slots are shared fairly per uid (`ConnectionSlots`), and a
/// connection's slot is given back the moment it is closed.
enum Listener {
    /// A burst of connections waits in the kernel's queue instead of failing.
    static let backlog: Int32 = 4096
    static let slots = ConnectionSlots()

    static func bind(path: String, mode: UInt32) throws(ListenerError) -> Int32 {
        var st = stat()
        if lstat(path, &st) == 0 {
            guard st.st_mode & S_IFMT == S_IFSOCK else { throw .notASocket }
            // A live broker answers; a stale socket file from a killed one is removed.
            let probe = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
            let live = ckh_connect_unix(probe, path) == 0
            close(probe)
            if live { throw .inUse }
            unlink(path)
        }
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw .system("socket", errno) }
        // On the listener, so that bytes sent before accept already carry their sender, and
        // every accepted socket inherits it (SCM_CREDENTIALS on every message).
        guard ckh_set_passcred(fd) == 0 else { let e = errno; close(fd); throw .system("SO_PASSCRED", e) }
        guard ckh_bind_unix(fd, path) == 0 else {
            let e = errno
            close(fd)
            throw e == ENAMETOOLONG ? .pathTooLong : .system("bind", e)
        }
        guard chmod(path, mode_t(mode)) == 0 else { let e = errno; close(fd); throw .system("chmod", e) }
        guard listen(fd, backlog) == 0 else { let e = errno; close(fd); throw .system("listen", e) }
        return fd
    }

    static func serve(_ listener: Int32, broker: Broker) -> Never {
        while true {
            let fd = ckh_accept_cloexec(listener)
            if fd < 0 {
                if errno == EINTR || errno == ECONNABORTED { continue }
                if errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM {
                    usleep(10_000)
                    continue
                }
                // The listener was shut down (SIGTERM): the signal thread exits the process.
                pause()
                continue
            }
            var pid: Int32 = 0, uid: UInt32 = 0, gid: UInt32 = 0
            guard ckh_peercred(fd, &pid, &uid, &gid) == 0, pid > 0 else {
                close(fd)
                continue
            }
            guard slots.acquire(uid: uid) else {
                broker.budget.suppress(uid: uid)
                answerBusy(fd)
                continue
            }
            _ = ckh_set_passcred(fd)
            // Backstops only: reads are bounded by the whole-frame deadlines of `Session`.
            var timeout = timeval(tv_sec: 130, tv_usec: 0)
            setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
            var sendTimeout = timeval(tv_sec: 30, tv_usec: 0)
            setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &sendTimeout, socklen_t(MemoryLayout<timeval>.size))
            let peer = Peer(fd: fd, pid: pid, uid: uid)
            let hold = SlotHold(slots, uid: uid)
            let started = DetachedThread.start {
                Session.serve(fd: fd, peer: peer, broker: broker, hold: hold)
                peer.close()
                close(fd)
                hold.giveBack()
            }
            if !started {
                peer.close()
                slots.release(uid: uid)
                answerBusy(fd)
            }
        }
    }

    /// A *busy* answer without reading the request: whatever the client already sent is
    /// drained first (so closing does not reset its connection), then one small frame into the
    /// new socket's empty send buffer, then close. Never blocks the accept loop.
    static func answerBusy(_ fd: Int32) {
        var scratch = [UInt8](repeating: 0, count: 4096)
        for _ in 0..<32 where recv(fd, &scratch, scratch.count, Int32(MSG_DONTWAIT)) > 0 {}
        let payload = BrokerMessage.response(Response(.busy, detail: "too many connections from this user; try again shortly")).encode()
        try? Frame.write(payload, to: fd)
        payload.wipe()
        shutdown(fd, Int32(SHUT_WR))
        _ = recv(fd, &scratch, scratch.count, Int32(MSG_DONTWAIT))
        close(fd)
    }
}
