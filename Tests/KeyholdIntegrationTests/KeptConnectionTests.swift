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

    /// The same attacks against an item the event loop's workers release themselves (policy
    /// `none`, no `--allow-exe`): a kept connection's later request is taken by a worker, which
    /// must name the process that sent it, and must hand a request from another user than the
    /// one that connected to a thread, where it is refused.
    @Test func keptConnectionsServedByTheEventLoopNameTheRealSenderAndRefuseAnotherUser() throws {
        let user = try TestUser(prefix: "khk")
        let b = try BrokerFixture()
        #expect(b.cli(["put", "svc", "open"], stdin: Array("loop-secret".utf8), asUser: user.name).status == 0)
        var senders: [String: Int] = [:]
        for attack in ["relay", "passfd"] {
            let r = hostile(b, [attack, Self.sleepExe, "svc", "open", "svc", "open"], as: user)
            // Any process of the owner may read a policy-none item: released, to the sender.
            #expect(r["first"] as? String == "ok" && r["outcome"] as? String == "ok" && r["released"] as? Bool == true, "\(attack): \(r)")
            #expect(r["sender"] as? Int != r["peer"] as? Int, "\(attack): \(r)")
            senders[attack] = r["sender"] as? Int
        }
        let entries = auditEntries(b)
        for attack in ["relay", "passfd"] {
            let e = entries.first { ($0["reason"] as? String) == attack }
            #expect(e?["outcome"] as? String == "ok" && e?["pid"] as? Int == senders[attack], "\(attack): \(String(describing: e))")
            #expect(e?["executable"] as? String == Self.pythonExe, "\(attack): \(String(describing: e))")
        }

        // Root's kept connection, after root's own get of its policy-none item: a child that
        // became the test user asks for root's item on it.
        #expect(b.cli(["put", "svc", "root"], stdin: Array("root-only".utf8)).status == 0)
        let run = runCommand("/usr/bin/python3", [Self.client, "crossuser", b.socketPath, "\(user.uid)", "svc", "root", "svc", "root"])
        let r = (try? JSONSerialization.jsonObject(with: Data(run.stdout))) as? [String: Any] ?? [:]
        #expect(r["first"] as? String == "ok", "root's own get: \(run.stdoutText) \(run.stderr)")
        #expect(r["outcome"] as? String == "not-authorized" && r["released"] as? Bool == false, "\(run.stdoutText) \(run.stderr)")
        let e = auditEntries(b).first { ($0["reason"] as? String) == "crossuser" }
        #expect(e?["outcome"] as? String == "not-authorized" && e?["pid"] as? Int == r["sender"] as? Int
                && e?["uid"] as? Int == Int(user.uid), "\(String(describing: e))")
        expectSecret(b.cli(["get", "svc", "root"]).stdoutText, equals: "root-only")
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

    /// A client that sends many gets of a 60 KiB secret on one connection and never reads an
    /// answer: once the socket holds all it can, the broker's send waits out the socket's send
    /// timeout (30 s for each write that made no progress: a frame partly taken, then nothing)
    /// and the session ends, closing the connection and freeing its thread and slot; it does not
    /// wait for as long as the client likes (before, it polled without end). Each answered get
    /// is audited.
    @Test func aClientThatNeverReadsItsAnswersIsLetGoAfterTheSendTimeout() throws {
        let user = try TestUser(prefix: "khk")
        let b = try BrokerFixture()
        let big = [UInt8](repeating: 0x61, count: 60 * 1024)
        #expect(b.cli(["put", "svc", "big"], stdin: big, asUser: user.name).status == 0)
        #expect(b.cli(["put", "svc", "a"], stdin: Array("kept-value".utf8), asUser: user.name).status == 0)
        let neverReads = hostileInBackground(b, ["neverreads", "svc", "big", "40", "75"], as: user)
        // Meanwhile another client's gets on a kept connection are answered: the answers the
        // first one leaves unread are written by a thread of their own (EventLoop.send), not by
        // the thread whose commit every other client waits for.
        usleep(2_000_000)
        let other = hostile(b, ["kept", "svc", "a", "5"], as: user)
        let r = neverReads()
        #expect(other["outcomes"] as? [String] == ["ok", "ok", "ok", "ok", "ok"], "\(other)")
        let answeredAt = other["answered_at"] as? Double ?? .infinity
        #expect(answeredAt < r["ended_at"] as? Double ?? 0, "the other client waited for the unread answers: \(other) \(r)")
        let seconds = r["seconds"] as? Double ?? 0
        #expect(r["ended"] as? Bool == true, "the broker still held the connection after 75 s: \(r)")
        #expect(seconds >= 25, "ended before the send timeout could pass: \(r)")
        // The broker still serves this user.
        expectSecret(b.cli(["get", "svc", "big"], asUser: user.name).stdout, equals: big)
        let answered = auditEntries(b).filter { ($0["reason"] as? String)?.hasPrefix("neverreads-") == true }
        #expect(!answered.isEmpty && answered.allSatisfy { ($0["outcome"] as? String) == "ok" }, "\(answered.count) entries")
    }

    /// Requests sent in parts on kept connections (more of them than the event loop has
    /// workers) are read by threads of their own with the request's deadline, and answered once
    /// whole; meanwhile another client's gets on its kept connection are answered.
    @Test func requestsSentInPartsOnKeptConnectionsHoldNoOneElse() throws {
        let user = try TestUser(prefix: "khk")
        let b = try BrokerFixture()
        #expect(b.cli(["put", "svc", "a"], stdin: Array("kept-value".utf8), asUser: user.name).status == 0)
        let ready = readyPath(b)
        let slow = hostileInBackground(b, ["keptslow", "svc", "a", "\(EventLoopWorkers.count + 2)", "2", ready], as: user)
        #expect(waitForFile(ready))
        let other = hostile(b, ["kept", "svc", "a", "5"], as: user)
        let r = slow()
        #expect(other["outcomes"] as? [String] == ["ok", "ok", "ok", "ok", "ok"], "\(other)")
        #expect((other["answered_at"] as? Double ?? .infinity) < (r["rest_at"] as? Double ?? 0),
                "the other client waited for the requests sent in parts: \(other) \(r)")
        let n = EventLoopWorkers.count + 2
        #expect(r["firsts"] as? [String] == Array(repeating: "ok", count: n) && r["seconds"] as? [String] == Array(repeating: "ok", count: n), "\(r)")
        let entries = auditEntries(b)
        for i in 0..<n {
            #expect(entries.contains { ($0["reason"] as? String) == "slow-\(i)" && ($0["outcome"] as? String) == "ok" }, "slow-\(i)")
        }
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

/// A `Vault` uses its kept connection again only while the process has the ids it connected
/// with (KeptConnection.Owner): a daemon that drops privileges between two requests must ask as
/// what it is now, on a connection of its own, not on the one root opened. Kept, that
/// connection would carry the request under root's `SO_PEERCRED` while the kernel's
/// `SCM_CREDENTIALS` names the new uid, which the broker refuses for every item.
@Suite struct KeptConnectionIdsTests {
    /// `setresuid`/`setresgid` for the calling thread only, through the raw system call:
    /// glibc's wrappers change every thread of this test process (POSIX semantics), which
    /// would change the ids of every other test running beside this one. Credentials are
    /// per thread in the kernel, and `getuid`/`geteuid` answer for the calling thread.
    private static let rawSyscall: @convention(c) (Int, Int, Int, Int) -> Int = {
        unsafeBitCast(dlsym(nil, "syscall")!,  // nil: RTLD_DEFAULT (libc's `syscall` is variadic, not imported)
                      to: (@convention(c) (Int, Int, Int, Int) -> Int).self)
    }()
    // <sys/syscall.h>'s numbers are macros of macros, which Swift does not import.
    #if arch(x86_64)
    private static let setresuidNumber = 117, setresgidNumber = 119
    #elseif arch(arm64)
    private static let setresuidNumber = 147, setresgidNumber = 149
    #endif
    /// Real, effective and saved ids all become the user's, as a daemon drops privileges (the
    /// kernel names the real uid in `SCM_CREDENTIALS` and the effective one in `SO_PEERCRED`).
    /// For good: the thread then ends.
    private static func dropThreadIds(to uid: UInt32, gid: UInt32) -> Bool {
        rawSyscall(setresgidNumber, Int(gid), Int(gid), Int(gid)) == 0
            && rawSyscall(setresuidNumber, Int(uid), Int(uid), Int(uid)) == 0
    }

    @Test func aVaultUsedAfterItsThreadDroppedPrivilegesConnectsAgainAsItsNewUser() throws {
        let user = try TestUser(prefix: "khi")
        let gid = try #require(getpwnam(user.name)).pointee.pw_gid
        let b = try BrokerFixture()
        #expect(b.cli(["put", "ids", "a"], stdin: Array("ids-root-value".utf8)).status == 0)
        #expect(b.cli(["put", "ids", "a"], stdin: Array("ids-user-value".utf8), asUser: user.name).status == 0)

        // Three gets on one Vault: as root and then as the user on a thread of their own (which
        // drops its ids between them), then as root on this thread. Each must reach the item of
        // the uid it asks as, over a connection that uid made.
        let vault = Vault(socketPath: b.socketPath)
        let get: @Sendable () -> Result<[UInt8], KeyholdError> = {
            do throws(KeyholdError) {
                let s = try vault.secret(service: "ids", account: "a")
                defer { s.wipe() }
                return .success(s.withUnsafeBytes { Array($0) })
            } catch { return .failure(error) }
        }
        let onThread = Mutex<(answers: [Result<[UInt8], KeyholdError>], dropped: Bool)>(([], false))
        let done = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            let first = get()
            let dropped = Self.dropThreadIds(to: user.uid, gid: gid) && getuid() == user.uid && geteuid() == user.uid
            let second = get()
            onThread.withLock { $0 = ([first, second], dropped) }
            done.signal()
        }
        done.wait()
        let (threadAnswers, dropped) = onThread.withLock { $0 }
        try #require(dropped && getuid() == 0 && geteuid() == 0, "only the helper thread's ids changed")
        let answers = threadAnswers + [get()]
        let expected = ["ids-root-value", "ids-user-value", "ids-root-value"]
        for (i, (answer, want)) in zip(answers, expected).enumerated() {
            switch answer {
            case .success(let value): expectSecret(value, equals: Array(want.utf8), "get \(i + 1)")
            case .failure(let error): Issue.record("get \(i + 1) failed: \(error)")
            }
        }
        // The broker saw the second request come from the user, on a connection the user made.
        let entries = b.cli(["audit", "--json"]).stdoutText.split(separator: "\n")
            .compactMap { try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] }
            .filter { ($0["service"] as? String) == "ids" && ($0["operation"] as? String) != "put" }
        #expect(entries.map { $0["uid"] as? Int } == [0, Int(user.uid), 0], "\(entries)")
        #expect(entries.map { $0["operation"] as? String } == ["get", "get", "get"], "\(entries)")
        #expect(entries.allSatisfy { ($0["outcome"] as? String) == "ok" }, "\(entries)")
    }

    /// A process whose real and effective uids differ (a set-user-ID program; a root daemon that
    /// changed only its effective uid) is two users at once: the kernel names the effective uid
    /// as the one that connected (`SO_PEERCRED`) and the real uid as the sender
    /// (`SCM_CREDENTIALS`). The broker refuses it for every item, and the entry names the real uid.
    @Test func aProcessWhoseRealAndEffectiveUidsDifferIsRefused() throws {
        let user = try TestUser(prefix: "khi")
        let gid = try #require(getpwnam(user.name)).pointee.pw_gid
        let b = try BrokerFixture()
        #expect(b.cli(["put", "mixed", "a"], stdin: Array("mixed-user-value".utf8), asUser: user.name).status == 0)
        let outcome = Mutex<(changed: Bool, answer: Result<Int, KeyholdError>?)>((false, nil))
        let done = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            // Effective ids only: real and saved stay root's. The thread then ends.
            let changed = Self.rawSyscall(Self.setresgidNumber, -1, Int(gid), -1) == 0
                && Self.rawSyscall(Self.setresuidNumber, -1, Int(user.uid), -1) == 0
                && getuid() == 0 && geteuid() == user.uid
            let answer: Result<Int, KeyholdError>
            do throws(KeyholdError) {
                let s = try Vault(socketPath: b.socketPath).secret(service: "mixed", account: "a")
                answer = .success(s.count)
                s.wipe()
            } catch { answer = .failure(error) }
            outcome.withLock { $0 = (changed, answer) }
            done.signal()
        }
        done.wait()
        let (changed, answer) = outcome.withLock { $0 }
        try #require(changed, "the test thread could not change its effective ids")
        guard case .failure(.notAuthorized)? = answer else {
            Issue.record("expected not authorized, got \(String(describing: answer.map { $0.map { "\($0) bytes" } }))")
            return
        }
        let entries = b.cli(["audit", "--json"]).stdoutText.split(separator: "\n")
            .compactMap { try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] }
            .filter { ($0["service"] as? String) == "mixed" && ($0["operation"] as? String) != "put" }
        #expect(entries.map { $0["operation"] as? String } == ["invalid"], "\(entries)")
        #expect(entries.map { $0["uid"] as? Int } == [0], "the real uid: \(entries)")
        #expect(entries.map { $0["outcome"] as? String } == ["not-authorized"], "\(entries)")
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

/// The broker's event-loop worker count (EventLoop.workers), which the tests outnumber.
enum EventLoopWorkers { static let count = 3 }
