import Foundation
import Glibc
import Synchronization

/// Whether a stream socket at `path` accepts a connection now (the connection is closed again).
public func socketAccepts(_ path: String) -> Bool {
    let fd = connectUnixSocket(path)
    if fd >= 0 { close(fd) }
    return fd >= 0
}

/// The address of the Unix socket at `path` and its length, or nil when the path is too long.
func unixSocketAddress(_ path: String) -> (sockaddr_un, socklen_t)? {
    var addr = sockaddr_un()
    addr.sun_family = sa_family_t(AF_UNIX)
    let bytes = Array(path.utf8)
    guard bytes.count < MemoryLayout.size(ofValue: addr.sun_path) else { return nil }
    withUnsafeMutableBytes(of: &addr.sun_path) { raw in raw.copyBytes(from: bytes); raw[bytes.count] = 0 }
    return (addr, socklen_t(MemoryLayout<sa_family_t>.size + bytes.count + 1))
}

/// A stream socket connected to `path`, or -1.
public func connectUnixSocket(_ path: String) -> Int32 {
    guard let (addr, len) = unixSocketAddress(path) else { return -1 }
    let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
    guard fd >= 0 else { return -1 }
    let rc = withUnsafePointer(to: addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, len) } }
    guard rc == 0 else { close(fd); return -1 }
    return fd
}

/// A listening Unix stream socket (close-on-exec) bound at `path`, for a test that plays the
/// broker's side of a connection; -1 when it could not be bound or listen.
public func listeningUnixSocket(at path: String, backlog: Int32) -> Int32 {
    guard let (addr, len) = unixSocketAddress(path) else { return -1 }
    let listener = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
    guard listener >= 0 else { return -1 }
    let bound = withUnsafePointer(to: addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(listener, $0, len) } }
    guard bound == 0, listen(listener, backlog) == 0 else { close(listener); return -1 }
    return listener
}
