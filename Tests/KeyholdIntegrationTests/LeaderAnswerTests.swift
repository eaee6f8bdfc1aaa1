import Foundation
import Glibc
import Synchronization
import Testing
import KeyholdClient
import KeyholdCore
import KeyholdProtocol
import KeyholdTestSupport

/// A `get` is answered by the leader of the group commit that holds its entry
/// (Session.answerByLeader). Against a client that sends requests without waiting for answers:
/// the answers still come in the order of the requests, and a client that stops reading them
/// holds up no one else's commit (the leader does not wait on one socket).
@Suite struct LeaderAnswerTests {
    static func getFrame(_ service: String, _ account: String) -> SecureBytes {
        var request = Request(.get, item: ItemReference(service: service, account: account))
        request.allowInteraction = false
        return ClientMessage.request(request).encode()
    }

    /// The final responses on `fd`, up to `count` or the end of the stream.
    static func responses(_ fd: Int32, count: Int) -> [Response] {
        var out: [Response] = []
        while out.count < count {
            guard let payload = try? Frame.read(from: fd), let message = try? BrokerMessage.decode(payload) else { break }
            if case .response(let r) = message { out.append(r) }
        }
        return out
    }

    /// A hundred gets sent back to back on one connection while four other clients keep the
    /// group commit busy, every other one for an item that is not there (refused on the
    /// session's own thread, where the others are answered by a leader after their commit):
    /// a hundred answers, each the one its request asked for, in order.
    @Test func answersToRequestsSentWithoutWaitingComeInOrder() throws {
        let b = try BrokerFixture()
        let vault = Vault(socketPath: b.socketPath)
        for i in 0..<50 { try vault.add(SecureBytes(copying: Array("order-\(i)".utf8)), service: "order", account: "a\(i)") }
        let stop = Atomic<Bool>(false), stopped = DispatchSemaphore(value: 0)
        for _ in 0..<4 {
            Thread {
                let load = Vault(socketPath: b.socketPath)
                while !stop.load(ordering: .relaxed) { (try? load.secret(service: "order", account: "a0"))?.wipe() }
                stopped.signal()
            }.start()
        }
        defer { stop.store(true, ordering: .relaxed); for _ in 0..<4 { stopped.wait() } }
        let fd = connectUnixSocket(b.socketPath)
        try #require(fd >= 0)
        defer { close(fd) }
        let writer = Thread {
            for i in 0..<50 {
                guard (try? Frame.write(Self.getFrame("order", "a\(i)"), to: fd)) != nil,
                      (try? Frame.write(Self.getFrame("order", "missing\(i)"), to: fd)) != nil else { return }
            }
        }
        writer.start()
        let answers = Self.responses(fd, count: 100)
        try #require(answers.count == 100, "\(answers.count) answers")
        for i in 0..<50 {
            let found = answers[2 * i], missing = answers[2 * i + 1]
            #expect(found.outcome == .ok, "request \(2 * i): \(found.outcome)")
            expectSecret(found.secret?.withUnsafeBytes { Array($0) }, equals: Array("order-\(i)".utf8), "answer \(2 * i)")
            #expect(missing.outcome == .notFound, "request \(2 * i + 1): \(missing.outcome)")
            found.secret?.wipe()
        }
    }

    /// One connection sends two hundred gets of a 4 KB secret and reads none of the answers, so
    /// its socket fills after about fifty. Another client's fifty gets meanwhile all succeed
    /// within 10 s (a leader that waited on the full socket would hold every commit for the
    /// 30 s send timeout), and the stuffed connection is ended: reading it, the answers stop
    /// short of two hundred.
    @Test func aClientThatDoesNotReadItsAnswersHoldsUpNoOneElse() throws {
        let b = try BrokerFixture()
        let vault = Vault(socketPath: b.socketPath)
        try vault.add(SecureBytes(copying: [UInt8](repeating: 0x61, count: 4_000)), service: "big", account: "a")
        try vault.add(SecureBytes(copying: Array("other-value".utf8)), service: "other", account: "a")
        let fd = connectUnixSocket(b.socketPath)
        try #require(fd >= 0)
        defer { close(fd) }
        let written = Atomic<Int>(0)
        let writer = Thread {
            // Blocks once the broker stops reading this connection; ends when it is shut.
            for _ in 0..<200 {
                guard (try? Frame.write(Self.getFrame("big", "a"), to: fd)) != nil else { return }
                written.add(1, ordering: .relaxed)
            }
        }
        writer.start()
        // Until the stuffed connection's answers have filled its socket (or 10 s).
        for _ in 0..<1_000 where written.load(ordering: .relaxed) < 100 { usleep(10_000) }

        let other = Vault(socketPath: b.socketPath)
        let failures = Mutex<[String]>([])
        let finished = DispatchSemaphore(value: 0)
        Thread {
            for _ in 0..<50 {
                do throws(KeyholdError) { try other.secret(service: "other", account: "a").wipe() } catch {
                    failures.withLock { $0.append("\(error)") }
                }
            }
            finished.signal()
        }.start()
        let inTime = finished.wait(timeout: .now() + 10) == .success
        if !inTime {
            // Free a leader stuck on the full socket, so that this fails instead of hanging.
            shutdown(fd, Int32(SHUT_RDWR))
            _ = finished.wait(timeout: .now() + 60)
        }
        #expect(inTime, "another client's 50 gets did not finish within 10 s")
        #expect(failures.withLock { $0 }.isEmpty, "\(failures.withLock { $0 })")

        let answers = Self.responses(fd, count: 200)
        #expect(answers.count < 200, "the connection that read nothing was not ended")
        #expect(answers.allSatisfy { $0.outcome == .ok }, "\(answers.map(\.outcome))")
        for a in answers { a.secret?.wipe() }
        shutdown(fd, Int32(SHUT_RDWR))
        while !writer.isFinished { usleep(10_000) }
    }
}
