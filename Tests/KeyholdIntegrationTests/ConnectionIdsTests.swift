import Foundation
import Glibc
import Synchronization
import Testing
import KeyholdClient
import KeyholdCore
import KeyholdProtocol
import KeyholdTestSupport

/// A daemon that drops privileges between two requests of one `Vault` asks as what it is now:
/// every request goes on a connection of its own. On one that root opened the request would
/// carry root's `SO_PEERCRED` while the kernel's `SCM_CREDENTIALS` names the new uid, which
/// the broker refuses for every item.
@Suite struct ConnectionIdsTests {
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
