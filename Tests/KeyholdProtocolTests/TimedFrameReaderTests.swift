import Foundation
import Glibc
import Testing
import KeyholdCore
import KeyholdTestSupport
@testable import KeyholdProtocol

/// Issue 8: the broker's frame reader bounds the whole frame, not each `read`, and names the
/// sender of the bytes from the kernel's credentials.
struct TimedFrameReaderTests {
    func pair() -> (reader: Int32, writer: Int32) {
        var fds: [Int32] = [0, 0]
        #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &fds) == 0)
        var on: Int32 = 1
        setsockopt(fds[0], SOL_SOCKET, SO_PASSCRED, &on, socklen_t(MemoryLayout<Int32>.size))
        return (fds[0], fds[1])
    }

    @Test func aTricklingFrameTimesOutAsAWhole() throws {
        let (r, w) = pair()
        defer { close(r); close(w) }
        // A frame header promising 100 bytes, then one byte every 50 ms: each read is quick,
        // the frame never completes within its 300 ms.
        let header: [UInt8] = [0, 0, 0, 100]
        #expect(write(w, header, 4) == 4)
        let writerFD = w
        let trickle = Thread {
            for _ in 0..<20 {
                var b: UInt8 = 0x41
                if send(writerFD, &b, 1, Int32(MSG_NOSIGNAL)) != 1 { return }
                usleep(50_000)
            }
        }
        trickle.start()
        var reader = TimedFrameReader(fd: r)
        var start = timespec(), end = timespec()
        clock_gettime(CLOCK_MONOTONIC, &start)
        #expect(throws: FrameError.io(ETIMEDOUT)) { try reader.read(idleMilliseconds: 300, frameMilliseconds: 300) }
        clock_gettime(CLOCK_MONOTONIC, &end)
        let ms = (end.tv_sec - start.tv_sec) * 1000 + (end.tv_nsec - start.tv_nsec) / 1_000_000
        #expect(ms < 1500, "the deadline held for the whole frame (took \(ms) ms)")
        while !trickle.isFinished { usleep(10_000) }
    }

    @Test func anIdleConnectionTimesOutAndSendersAreNamed() throws {
        let (r, w) = pair()
        defer { close(r); close(w) }
        var reader = TimedFrameReader(fd: r)
        #expect(throws: FrameError.io(ETIMEDOUT)) { try reader.read(idleMilliseconds: 100, frameMilliseconds: 1000) }
        let frame: [UInt8] = [0, 0, 0, 3, 1, 2, 3]
        #expect(write(w, frame, frame.count) == frame.count)
        let payload = try reader.read(idleMilliseconds: 1000, frameMilliseconds: 1000)
        #expect(payload?.withUnsafeBytes { Array($0) } == [1, 2, 3])
        #expect(reader.senders == [FrameSender(pid: getpid(), uid: getuid(), gid: getgid())])
        close(w)
        #expect(try reader.read(idleMilliseconds: 1000, frameMilliseconds: 1000) == nil)
    }

    /// With `SO_PASSPIDFD` (Linux 6.5+) each sender comes with the kernel's pidfd of it, which
    /// names the process that sent; the reader holds it only until its next frame.
    @Test(.enabled(if: Self.kernelPassesPIDFDs)) func eachSenderComesWithItsPIDFDHeldUntilTheNextFrame() throws {
        let (r, w) = pair()
        defer { close(r); close(w) }
        var on: Int32 = 1
        try #require(setsockopt(r, SOL_SOCKET, Self.soPassPIDFD, &on, socklen_t(MemoryLayout<Int32>.size)) == 0)
        var reader = TimedFrameReader(fd: r)
        weak var previous: SenderPIDFD?
        for i in 0..<50 {
            let frame: [UInt8] = [0, 0, 0, 2, 7, UInt8(i)]
            #expect(write(w, frame, frame.count) == frame.count)
            _ = try reader.read(idleMilliseconds: 1000, frameMilliseconds: 1000)
            // The last frame's pidfd was let go (and so closed: SenderPIDFD's deinit).
            #expect(previous == nil, "frame \(i): the previous frame's pidfd is still held")
            guard case .open(let handle)? = reader.senders.first?.handle else {
                Issue.record("frame \(i): no pidfd came with the bytes: \(reader.senders)")
                return
            }
            let info = (try? String(contentsOfFile: "/proc/self/fdinfo/\(handle.fd)", encoding: .utf8)) ?? ""
            #expect(info.split(separator: "\n").contains("Pid:\t\(getpid())"), "frame \(i): \(info)")
            previous = handle
        }
    }

    /// Not in glibc 2.36's headers; Linux's value.
    static let soPassPIDFD: Int32 = 76
    static var kernelPassesPIDFDs: Bool {
        let s = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(s) }
        var on: Int32 = 1
        return setsockopt(s, SOL_SOCKET, soPassPIDFD, &on, socklen_t(MemoryLayout<Int32>.size)) == 0
    }

    /// The payload is first read without waiting (it usually came with its header); one that
    /// comes later, in parts, is still waited for and read whole, and a second frame sent in
    /// the same write is left for the next read.
    @Test func aPayloadThatComesAfterItsHeaderIsWaitedForAndReadWhole() throws {
        let (r, w) = pair()
        defer { close(r); close(w) }
        #expect(write(w, [0, 0, 0, 4] as [UInt8], 4) == 4)
        let writerFD = w
        let late = Thread {
            usleep(100_000)
            _ = send(writerFD, [9, 8, 7] as [UInt8], 3, Int32(MSG_NOSIGNAL))
            usleep(50_000)
            _ = send(writerFD, [6, 0, 0, 0, 2, 5, 4] as [UInt8], 7, Int32(MSG_NOSIGNAL))
        }
        late.start()
        var reader = TimedFrameReader(fd: r)
        let first = try reader.read(idleMilliseconds: 2000, frameMilliseconds: 2000)
        #expect(first?.withUnsafeBytes { Array($0) } == [9, 8, 7, 6])
        let second = try reader.read(idleMilliseconds: 2000, frameMilliseconds: 2000)
        #expect(second?.withUnsafeBytes { Array($0) } == [5, 4])
        while !late.isFinished { usleep(10_000) }
    }

    /// A frame sent with one write is read with one credentialed read (its header peeked
    /// first): two frames in one write are still read one at a time, each with its sender.
    @Test func twoFramesInOneWriteAreReadOneAtATime() throws {
        let (r, w) = pair()
        defer { close(r); close(w) }
        let both: [UInt8] = [0, 0, 0, 3, 1, 2, 3, 0, 0, 0, 2, 4, 5]
        #expect(write(w, both, both.count) == both.count)
        var reader = TimedFrameReader(fd: r)
        let me = FrameSender(pid: getpid(), uid: getuid(), gid: getgid())
        #expect(try reader.read(idleMilliseconds: 1000, frameMilliseconds: 1000)?.withUnsafeBytes { Array($0) } == [1, 2, 3])
        #expect(reader.senders == [me])
        #expect(try reader.read(idleMilliseconds: 1000, frameMilliseconds: 1000)?.withUnsafeBytes { Array($0) } == [4, 5])
        #expect(reader.senders == [me])
    }

    /// A header that is refused (a frame too long or too short) is read with its sender's
    /// credentials before the refusal, which therefore names who sent it.
    @Test func aRefusedHeaderIsReadWithItsSender() throws {
        let cases: [([UInt8], FrameError)] = [
            ([0x7f, 0xff, 0xff, 0xff, 1], .oversized(0x7fff_ffff)),
            ([0, 0, 0, 1, 1], .malformed("frame too short")),
        ]
        for (bytes, error) in cases {
            let (r, w) = pair()
            defer { close(r); close(w) }
            #expect(write(w, bytes, bytes.count) == bytes.count)
            var reader = TimedFrameReader(fd: r)
            #expect(throws: error) { try reader.read(idleMilliseconds: 1000, frameMilliseconds: 1000) }
            #expect(reader.senders == [FrameSender(pid: getpid(), uid: getuid(), gid: getgid())], "\(bytes)")
        }
    }

    /// A header that comes in two writes is waited for and read whole.
    @Test func aHeaderInPartsIsWaitedFor() throws {
        let (r, w) = pair()
        defer { close(r); close(w) }
        #expect(write(w, [0, 0] as [UInt8], 2) == 2)
        let writerFD = w
        let late = Thread {
            usleep(50_000)
            _ = send(writerFD, [0, 3, 1, 2, 3] as [UInt8], 5, Int32(MSG_NOSIGNAL))
        }
        late.start()
        var reader = TimedFrameReader(fd: r)
        #expect(try reader.read(idleMilliseconds: 2000, frameMilliseconds: 2000)?.withUnsafeBytes { Array($0) } == [1, 2, 3])
        #expect(reader.senders == [FrameSender(pid: getpid(), uid: getuid(), gid: getgid())])
        while !late.isFinished { usleep(10_000) }
    }

    /// A frame whose header and first byte one process wrote and whose rest another did names
    /// both, in order: the read that takes header and payload together stops where the
    /// kernel's record of the writer changes.
    @Test func aFrameWrittenByTwoProcessesNamesBoth() throws {
        let (r, w) = pair()
        defer { close(r); close(w) }
        #expect(write(w, [0, 0, 0, 3, 1] as [UInt8], 5) == 5)
        let child = Process()
        child.executableURL = URL(fileURLWithPath: "/bin/sh")
        child.arguments = ["-c", "printf '\\002\\003'"]
        child.standardOutput = FileHandle(fileDescriptor: w, closeOnDealloc: false)
        try child.run()
        child.waitUntilExit()
        var reader = TimedFrameReader(fd: r)
        #expect(try reader.read(idleMilliseconds: 1000, frameMilliseconds: 1000)?.withUnsafeBytes { Array($0) } == [1, 2, 3])
        #expect(reader.senders.map(\.pid) == [getpid(), child.processIdentifier])
    }

    /// Descriptors a peer attaches to a frame (`SCM_RIGHTS`) are closed, not kept: the header's
    /// peek takes none, and the read of header and payload closes what came with them. The
    /// frame is read as sent, and afterwards no descriptor of this process names the file that
    /// was passed (a file of this test's own, so tests running beside it do not count).
    @Test func descriptorsSentWithAFrameAreClosed() throws {
        let (r, w) = pair()
        defer { close(r); close(w) }
        let path = TestPaths.temporaryDirectory("kh-passed") + "/passed"
        let made = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        try #require(made >= 0)
        close(made)
        var reader = TimedFrameReader(fd: r)
        for round in 0..<20 {
            let passed = open(path, O_RDONLY | O_CLOEXEC)
            try #require(passed >= 0)
            let frame: [UInt8] = [0, 0, 0, 3, 7, 8, UInt8(round)]
            #expect(Self.sendWithDescriptor(frame, passing: passed, on: w) == frame.count)
            close(passed)
            let payload = try reader.read(idleMilliseconds: 1000, frameMilliseconds: 1000)
            #expect(payload?.withUnsafeBytes { Array($0) } == [7, 8, UInt8(round)])
        }
        let held = ((try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? []).filter {
            (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/" + $0)) == path
        }
        #expect(held.isEmpty, "descriptors passed with frames were kept: \(held)")
    }

    /// sendmsg of `bytes` with `fd` attached as SCM_RIGHTS.
    static func sendWithDescriptor(_ bytes: [UInt8], passing fd: Int32, on socket: Int32) -> Int {
        var data = bytes
        let space = 24  // CMSG_SPACE(sizeof(int)) on 64-bit Linux: 16-byte header, 4 bytes, padding
        var control = [UInt8](repeating: 0, count: space)
        control.withUnsafeMutableBytes { c in
            c.storeBytes(of: 20, toByteOffset: 0, as: Int.self)  // cmsg_len = CMSG_LEN(sizeof(int))
            c.storeBytes(of: SOL_SOCKET, toByteOffset: 8, as: Int32.self)
            c.storeBytes(of: Int32(SCM_RIGHTS), toByteOffset: 12, as: Int32.self)
            c.storeBytes(of: fd, toByteOffset: 16, as: Int32.self)
        }
        return data.withUnsafeMutableBytes { d in
            control.withUnsafeMutableBytes { c in
                var iov = iovec(iov_base: d.baseAddress, iov_len: d.count)
                return withUnsafeMutablePointer(to: &iov) { iovp in
                    var msg = msghdr(msg_name: nil, msg_namelen: 0, msg_iov: iovp, msg_iovlen: 1,
                                     msg_control: c.baseAddress, msg_controllen: space, msg_flags: 0)
                    return Glibc.sendmsg(socket, &msg, 0)
                }
            }
        }
    }
}
