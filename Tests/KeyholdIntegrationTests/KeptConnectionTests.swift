import Foundation
import Glibc
import Synchronization
import Testing
import KeyholdClient
import KeyholdCore
import KeyholdProtocol
import KeyholdTestSupport

/// A connection kept for more than one request (Session.serve, KeptConnection.swift) carries no
/// identity of its own: the broker identifies the sender of every request anew, audits each,
/// ends the connection on a malformed frame, and lets an idle one go.
extension HostileLocalUserTests {
    @Test func keptConnectionIdentifiesTheSenderOfEveryRequestAnew() throws {
        let user = try TestUser(prefix: "khk")
        let b = try BrokerFixture()
        #expect(b.cli(["put", "allowed", "x", "--allow-exe", Self.sleepExe], stdin: Array("kept-secret".utf8), asUser: user.name).status == 0)
        #expect(b.cli(["put", "python", "x", "--allow-exe", Self.pythonExe], stdin: Array("py".utf8), asUser: user.name).status == 0)

        // The connector first asks for its own item (released), then the connection changes
        // hands (fork, descriptor passing) or the connector execs the allowed program.
        var senders: [String: Int] = [:]
        for attack in ["relay", "passfd", "sendexec"] {
            let r = hostile(b, [attack, Self.sleepExe, "allowed", "x", "python", "x"], as: user)
            #expect(r["first"] as? String == "ok", "\(attack): the honest first request: \(r)")
            #expect(r["outcome"] as? String == "not-authorized" && r["released"] as? Bool == false, "\(attack): \(r)")
            senders[attack] = r["sender"] as? Int
        }
        let entries = auditEntries(b).filter { ($0["operation"] as? String) == "get" }
        #expect(entries.filter { ($0["reason"] as? String) == "kept-first" && ($0["outcome"] as? String) == "ok" }.count == 3)
        expectAttacksAuditedWithTheirSenders(entries, senders)
    }

    @Test func keptConnectionAuditsEachRequestAndIsLetGoWhenIdle() throws {
        let user = try TestUser(prefix: "khk")
        let b = try BrokerFixture()
        #expect(b.cli(["put", "svc", "a"], stdin: Array("kept-value".utf8), asUser: user.name).status == 0)
        let r = hostile(b, ["kept", "svc", "a", "5"], as: user)
        #expect(r["outcomes"] as? [String] == ["ok", "ok", "ok", "ok", "ok"], "\(r)")
        // Kept open after the last answer (not closed at once), then closed by the broker.
        let idle = r["idle"] as? Double ?? 0
        #expect(r["closed"] as? Bool == true && idle > 0.5, "\(r)")
        // A client that closes with its answer unread (the broker's next read sees a reset).
        _ = hostile(b, ["unread", "svc", "a"], as: user)
        // The broker has let that connection go once another request is answered after it.
        expectSecret(b.cli(["get", "svc", "a"], asUser: user.name).stdoutText, equals: "kept-value")
        #expect(auditEntries(b).contains { ($0["reason"] as? String) == "unread" && ($0["outcome"] as? String) == "ok" })
        let entries = auditEntries(b)
        for i in 0..<5 {
            let e = entries.first { ($0["reason"] as? String) == "kept-\(i)" }
            #expect(e?["outcome"] as? String == "ok" && e?["pid"] as? Int == r["pid"] as? Int, "kept-\(i): \(String(describing: e))")
        }
        // Letting an idle connection go, or one closed with its answer unread, is not a
        // malformed request.
        #expect(!entries.contains { ($0["operation"] as? String) == "invalid" }, "\(entries.filter { ($0["operation"] as? String) == "invalid" })")
    }

    @Test func malformedFrameOnAKeptConnectionIsAnsweredAuditedAndEndsIt() throws {
        let user = try TestUser(prefix: "khk")
        let b = try BrokerFixture()
        #expect(b.cli(["put", "svc", "a"], stdin: Array("kept-value".utf8), asUser: user.name).status == 0)
        let r = hostile(b, ["keptgarbage", "svc", "a"], as: user)
        #expect(r["first"] as? String == "ok" && r["second"] as? Int == Int(Outcome.usage.rawValue) && r["closed"] as? Bool == true, "\(r)")
        #expect(auditEntries(b).contains { ($0["operation"] as? String) == "invalid" && ($0["outcome"] as? String) == "usage" })
        // The item is intact.
        expectSecret(b.cli(["get", "svc", "a"], asUser: user.name).stdoutText, equals: "kept-value")
    }

    /// The client library keeps one connection per `Vault` between requests, and opens a new
    /// one when the broker it kept it with is gone.
    @Test func vaultKeepsOneConnectionAndReconnectsAfterTheBrokerRestarts() throws {
        let b = try BrokerFixture()
        let vault = Vault(socketPath: b.socketPath)
        try vault.add(SecureBytes(copying: Array("v1".utf8)), service: "kept", account: "a")
        func brokerSockets() -> Int {
            let dir = "/proc/\(b.pid)/fd"
            return ((try? FileManager.default.contentsOfDirectory(atPath: dir)) ?? []).filter {
                (try? FileManager.default.destinationOfSymbolicLink(atPath: dir + "/" + $0))?.hasPrefix("socket:") == true
            }.count
        }
        let before = brokerSockets()
        for _ in 0..<10 { try vault.secret(service: "kept", account: "a").wipe() }
        #expect(brokerSockets() == before, "ten gets on one Vault opened connections of their own")
        let other = Vault(socketPath: b.socketPath)
        try other.secret(service: "kept", account: "a").wipe()
        #expect(brokerSockets() == before + 1, "a second Vault keeps a connection of its own")

        b.stop()
        try b.start()
        // The kept connection died with the old broker: the next request goes on a new one.
        let value = try vault.secret(service: "kept", account: "a")
        expectSecret(value.withUnsafeBytes { Array($0) }, equals: Array("v1".utf8))
        value.wipe()
        try vault.update(SecureBytes(copying: Array("v2".utf8)), service: "kept", account: "a")
        try expectSecret(vault.secret(service: "kept", account: "a").withUnsafeBytes { Array($0) }, equals: Array("v2".utf8))
    }
}

/// A broker that closes each connection after one answer without reading more (a broker from
/// before keep-alive, or one stopping): the kept connection is often closed between the
/// client's check and its next send. The client then asks again on a new connection, because
/// the request was never read; no call fails.
@Suite struct KeptConnectionRetryTests {
    @Test func aKeptConnectionClosedBeforeItsRequestWasReadIsRetriedOnANewOne() throws {
        let path = TestPaths.temporaryDirectory("kh-oneshot") + "/k.sock"
        let listener = listeningUnixSocket(at: path, backlog: 64)
        try #require(listener >= 0)
        let served = Atomic<Int>(0)
        Thread.detachNewThread {
            while true {
                let fd = accept(listener, nil, nil)
                if fd < 0 { return }
                _ = try? Frame.read(from: fd)
                // Counted before the answer goes out: once the client holds its last answer,
                // the count must already include it (counted after, a loaded machine could
                // show 1,999 of 2,000).
                served.add(1, ordering: .relaxed)
                try? Frame.write(BrokerMessage.response(Response(.ok, detail: "key-protector=file")).encode(), to: fd)
                close(fd)  // one request per connection, unread bytes and all
            }
        }
        defer { shutdown(listener, Int32(SHUT_RDWR)); close(listener); unlink(path) }
        let vault = Vault(socketPath: path)
        var failures: [String] = []
        for _ in 0..<2000 {
            do throws(KeyholdError) { _ = try vault.protectionStatus() } catch { failures.append("\(error)") }
        }
        #expect(failures.isEmpty, "\(failures.count) of 2000 failed, e.g. \(failures.first ?? "")")
        #expect(served.load(ordering: .relaxed) == 2000, "every request answered once (none asked twice after it was read)")
    }
}
