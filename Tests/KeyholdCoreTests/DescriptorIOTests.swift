import Foundation
import Glibc
import Testing
import KeyholdCore

/// `DescriptorIO.writeAll` against real sockets whose other end never reads: a blocking socket
/// gives up once its own send timeout passes (the broker's answers to a client that reads
/// nothing: the session thread is let go); a non-blocking one waits for its deadline; and one
/// that is read gets everything.
@Suite(.timeLimit(.minutes(1))) struct DescriptorIOTests {
    static func socketPair() -> (Int32, Int32) {
        var fds: [Int32] = [-1, -1]
        precondition(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &fds) == 0)
        return (fds[0], fds[1])
    }

    /// Runs `writeAll` of `bytes` bytes on a thread; its result, or nil when it had not
    /// returned within `seconds` (the thread is then left blocked, the sockets open).
    static func write(_ fd: Int32, bytes: Int, socket: Bool = true, deadline: UInt64? = nil, within seconds: Double) -> (code: Int32, seconds: Double)? {
        let done = DispatchSemaphore(value: 0)
        nonisolated(unsafe) var result: (Int32, Double) = (0, 0)
        Thread.detachNewThread {
            let buffer = [UInt8](repeating: 0x5a, count: bytes)
            let start = MonotonicClock.nanoseconds()
            let code = buffer.withUnsafeBytes { DescriptorIO.writeAll(fd, $0, socket: socket, deadline: deadline) }
            result = (code, Double(MonotonicClock.nanoseconds() - start) / 1e9)
            done.signal()
        }
        return done.wait(timeout: .now() + seconds) == .success ? result : nil
    }

    @Test func aBlockingSocketGivesUpWhenItsSendTimeoutPasses() throws {
        let (mine, theirs) = Self.socketPair()
        defer { close(mine); close(theirs) }
        var timeout = timeval(tv_sec: 0, tv_usec: 300_000)
        #expect(setsockopt(mine, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size)) == 0)
        // Far more than the socket buffers hold; nothing reads `theirs`.
        let r = try #require(Self.write(mine, bytes: 8 << 20, within: 20), "writeAll still waiting 20 s after a 0.3 s send timeout")
        #expect(r.code == ETIMEDOUT)
        #expect(r.seconds >= 0.25)
    }

    @Test func aNonBlockingSocketWaitsForItsDeadline() throws {
        let (mine, theirs) = Self.socketPair()
        defer { close(mine); close(theirs) }
        #expect(fcntl(mine, F_SETFL, fcntl(mine, F_GETFL) | O_NONBLOCK) == 0)
        let r = try #require(Self.write(mine, bytes: 8 << 20, deadline: MonotonicClock.nanoseconds() + 400_000_000, within: 20))
        #expect(r.code == ETIMEDOUT)
        #expect(r.seconds >= 0.35)
    }

    @Test func aSocketThatIsReadGetsEveryByte() throws {
        let (mine, theirs) = Self.socketPair()
        defer { close(mine); close(theirs) }
        var timeout = timeval(tv_sec: 5, tv_usec: 0)
        #expect(setsockopt(mine, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size)) == 0)
        let total = 4 << 20
        let reader = DispatchSemaphore(value: 0)
        nonisolated(unsafe) var received = 0
        Thread.detachNewThread {
            var buffer = [UInt8](repeating: 0, count: 65536)
            while received < total {
                let n = read(theirs, &buffer, buffer.count)
                if n <= 0 { break }
                received += n
            }
            reader.signal()
        }
        let r = try #require(Self.write(mine, bytes: total, within: 20))
        #expect(r.code == 0)
        #expect(reader.wait(timeout: .now() + 20) == .success)
        #expect(received == total)
    }
}
