import Foundation
import Glibc
import Synchronization
import Testing
import KeyholdClient
import KeyholdCore
import KeyholdProtocol
import KeyholdTestSupport

/// A client waiting for its answer sleeps once per request (BrokerConnection.receive waits in
/// poll): the broker reading the request must not wake it. A thread blocked in a Unix socket's
/// `read` is woken by the kernel's write-space wake-up when the peer reads what it sent, then
/// sleeps again: a second wake-up per request, which cost the benchmark's 64 clients about a
/// tenth of their throughput (docs/BENCHMARKS.md).
@Suite struct ClientWaitTests {
    /// The test's broker reads each request only once the client is asleep waiting for the
    /// answer, and answers 20 ms later; the client thread's voluntary context switches over the
    /// requests are then one per request, not two.
    @Test func readingARequestDoesNotWakeTheClientWaitingForItsAnswer() throws {
        let path = TestPaths.temporaryDirectory("kh-wait") + "/k.sock"
        let listener = listeningUnixSocket(at: path, backlog: 4)
        try #require(listener >= 0)
        defer { shutdown(listener, Int32(SHUT_RDWR)); close(listener); unlink(path) }

        let requests = 10
        let clientTID = Atomic<Int32>(0)
        let unordered = Atomic<Int>(0)
        Thread.detachNewThread {
            for _ in 0..<requests {
                // One request per connection, as the broker serves them.
                let fd = accept(listener, nil, nil)
                if fd < 0 { return }
                defer { close(fd) }
                // The request is there, unread; wait until the client sleeps for the answer.
                var ready = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
                guard poll(&ready, 1, 5_000) == 1 else { return }
                if !Self.waitUntilAsleep(tid: clientTID.load(ordering: .acquiring)) { unordered.add(1, ordering: .relaxed) }
                guard (try? Frame.read(from: fd)) != nil else { return }
                usleep(20_000)
                guard (try? Frame.write(BrokerMessage.response(Response(.ok, detail: "key-protector=file")).encode(), to: fd)) != nil
                else { return }
            }
        }

        let vault = Vault(socketPath: path)
        clientTID.store(try Self.threadID(), ordering: .releasing)
        let before = try Self.voluntarySwitches()
        for _ in 0..<requests { _ = try vault.protectionStatus() }
        let switches = try Self.voluntarySwitches() - before

        try #require(unordered.load(ordering: .relaxed) == 0, "the client was asleep before each request was read")
        // One sleep per request; some slack for a lock the runtime may wait on under load. Woken
        // also by the read, the thread would switch twice per request (20 here).
        #expect(switches <= requests + 4, "\(switches) voluntary context switches for \(requests) requests")
        #expect(switches >= requests, "the client slept for each answer (the test's broker delayed every one)")
    }

    /// This thread's voluntary context switches so far (/proc/thread-self/status).
    static func voluntarySwitches() throws -> Int {
        let status = try String(contentsOfFile: "/proc/thread-self/status", encoding: .utf8)
        for line in status.split(separator: "\n") where line.hasPrefix("voluntary_ctxt_switches:") {
            if let n = Int(line.split(separator: ":")[1].trimmingCharacters(in: .whitespaces)) { return n }
        }
        throw POSIXError(.EINVAL)
    }

    /// This thread's id, from /proc/thread-self ("PID/task/TID").
    static func threadID() throws -> Int32 {
        let target = try FileManager.default.destinationOfSymbolicLink(atPath: "/proc/thread-self")
        guard let last = target.split(separator: "/").last, let tid = Int32(last) else { throw POSIXError(.EINVAL) }
        return tid
    }

    /// Waits (up to 5 s) until thread `tid` of this process is sleeping (state S in its stat line).
    static func waitUntilAsleep(tid: Int32) -> Bool {
        for _ in 0..<5_000 {
            if let stat = try? String(contentsOfFile: "/proc/self/task/\(tid)/stat", encoding: .utf8),
               let close = stat.lastIndex(of: ")"),
               stat[stat.index(close, offsetBy: 2)...].first == "S" { return true }
            usleep(1_000)
        }
        return false
    }
}
