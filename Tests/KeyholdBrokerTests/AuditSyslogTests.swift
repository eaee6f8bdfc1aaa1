import Foundation
import Glibc
import Synchronization
import Testing
import KeyholdTestSupport
@testable import KeyholdBroker

/// The audit copy to the system log keeps one connected socket: a receiver restarted at the
/// path (a new socket there, as a restarted journald or rsyslog binds) gets the next line, a
/// receiver that appears later is found again, and senders racing a reconnection lose nothing
/// but lines sent while no receiver was bound.
@Suite struct AuditSyslogTests {
    /// A datagram socket bound at `path`, read without waiting.
    final class Receiver {
        let fd: Int32
        init(_ path: String) throws {
            unlink(path)
            fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
            var addr = sockaddr_un()
            addr.sun_family = sa_family_t(AF_UNIX)
            let bytes = Array(path.utf8)
            withUnsafeMutableBytes(of: &addr.sun_path) { raw in raw.copyBytes(from: bytes); raw[bytes.count] = 0 }
            let len = socklen_t(MemoryLayout<sa_family_t>.size + bytes.count + 1)
            let rc = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, len) } }
            guard fd >= 0, rc == 0 else { throw POSIXError(.EADDRINUSE) }
        }
        /// Every datagram queued now.
        func lines() -> [String] {
            var out: [String] = [], buf = [UInt8](repeating: 0, count: 4096)
            while true {
                let n = recv(fd, &buf, buf.count, 0)
                if n <= 0 { return out }
                out.append(String(decoding: buf[0..<n], as: UTF8.self))
            }
        }
        deinit { close(fd) }
    }

    static func directory() -> String { TestPaths.temporaryDirectory("kh-syslog") }

    @Test func aReceiverRestartedAtThePathGetsTheNextLine() throws {
        let path = Self.directory() + "/log"
        var receiver = try Receiver(path)
        let log = AuditSyslog(socketPath: path)
        log.send("first")
        let first = receiver.lines()
        #expect(first.map { $0.hasSuffix(": first") } == [true])
        #expect(first.first?.hasPrefix("<86>") == true, "authpriv.info")
        receiver = try Receiver(path)  // the old socket closed, a new one bound at the path
        log.send("second")
        #expect(receiver.lines().map { $0.hasSuffix(": second") } == [true])
    }

    @Test func aReceiverThatAppearsLaterIsFound() throws {
        let path = Self.directory() + "/log"
        let log = AuditSyslog(socketPath: path)
        log.send("nobody hears this")  // skipped: nothing at the path
        let receiver = try Receiver(path)
        // Tried again at most once a second: a line sent each 50 ms arrives within a few seconds.
        var got: [String] = []
        for _ in 0..<200 where got.isEmpty {
            log.send("found")
            got = receiver.lines()
            if got.isEmpty { usleep(50_000) }
        }
        #expect(!got.isEmpty && got.allSatisfy { $0.hasSuffix(": found") })
    }

    @Test func sendersRacingReconnectionsReachTheLastReceiver() throws {
        let path = Self.directory() + "/log"
        var receiver = try Receiver(path)
        let log = AuditSyslog(socketPath: path)
        let stop = ManagedAtomicFlag()
        let finished = Atomic<Int>(0)
        let threads = (0..<4).map { i in
            Thread {
                while !stop.isSet { log.send("thread \(i)"); usleep(200) }
                finished.add(1, ordering: .releasing)
            }
        }
        threads.forEach { $0.start() }
        for _ in 0..<20 {
            usleep(5_000)
            receiver = try Receiver(path)
        }
        stop.set()
        // Every sender has returned (bounded), so no line of theirs can follow the drain.
        for _ in 0..<3000 where finished.load(ordering: .acquiring) < threads.count { usleep(10_000) }
        #expect(finished.load(ordering: .acquiring) == threads.count)
        _ = receiver.lines()
        log.send("after the race")
        #expect(receiver.lines().map { $0.hasSuffix(": after the race") } == [true])
    }
}

/// A flag set once, read from other threads.
final class ManagedAtomicFlag: @unchecked Sendable {
    private let lock = NSLock()
    private var value = false
    var isSet: Bool { lock.lock(); defer { lock.unlock() }; return value }
    func set() { lock.lock(); value = true; lock.unlock() }
}
