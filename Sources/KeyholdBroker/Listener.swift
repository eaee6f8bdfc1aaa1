import Foundation
import Glibc
import Synchronization
import CKeyholdOS

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

/// The Unix socket and its accept loop: one thread per connection, so a slow PAM
/// conversation holds up no one else.
enum Listener {
    /// Most connections served at once; beyond it new ones are closed at once.
    static let maxSessions = 256
    static let active = Atomic<Int>(0)

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
        guard ckh_bind_unix(fd, path) == 0 else {
            let e = errno
            close(fd)
            throw e == ENAMETOOLONG ? .pathTooLong : .system("bind", e)
        }
        guard chmod(path, mode_t(mode)) == 0 else { let e = errno; close(fd); throw .system("chmod", e) }
        guard listen(fd, 128) == 0 else { let e = errno; close(fd); throw .system("listen", e) }
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
            guard active.add(1, ordering: .relaxed).newValue <= maxSessions else {
                active.subtract(1, ordering: .relaxed)
                close(fd)
                continue
            }
            // A client that stops talking mid-conversation does not hold a thread forever.
            var timeout = timeval(tv_sec: 120, tv_usec: 0)
            setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
            var sendTimeout = timeval(tv_sec: 30, tv_usec: 0)
            setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &sendTimeout, socklen_t(MemoryLayout<timeval>.size))
            let thread = Thread {
                defer {
                    close(fd)
                    active.subtract(1, ordering: .relaxed)
                }
                guard let caller = Caller.identify(socket: fd) else { return }
                Session(fd: fd, caller: caller, broker: broker).run()
            }
            thread.stackSize = 1 << 20
            thread.start()
        }
    }
}
