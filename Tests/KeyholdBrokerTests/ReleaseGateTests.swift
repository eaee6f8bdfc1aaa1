import Foundation
import Glibc
import Synchronization
import Testing
import KeyholdAuth
import KeyholdCore
import KeyholdVault
import KeyholdProtocol
import KeyholdTestSupport
@testable import KeyholdBroker

/// The release gate driven directly: a scripted conversation, a clock the test sets, the
/// lockout record in a real SQLite vault, and real libpam (through the broker's PAM helper)
/// with private test stacks whose outcome is fixed: `pam_permit` says yes, `pam_deny` no.
@Suite struct ReleaseGateTests {
    final class FakeClock: GateClock {
        private let now = Mutex<Int64>(1_800_000_000_000_000)
        func microseconds() -> Int64 { now.withLock { $0 } }
        func advance(seconds: Int64) { now.withLock { $0 += seconds * 1_000_000 } }
    }

    /// What the gate said to the person, and the answers it gets.
    final class Script: Conversation, @unchecked Sendable {
        private let lock = Mutex<(announced: Int, prompts: [Prompt.Purpose], answers: [String?])>((0, [], []))
        /// Runs inside `announce` (after the attempt is reserved, before PAM).
        var onAnnounce: (@Sendable () -> Void)?
        init(answers: [String?] = []) { lock.withLock { $0.answers = answers } }
        var announced: Int { lock.withLock { $0.announced } }
        var prompts: [Prompt.Purpose] { lock.withLock { $0.prompts } }
        var interruptFD: Int32? { nil }
        func announce(_ announcement: Announcement) -> Bool {
            lock.withLock { $0.announced += 1 }
            onAnnounce?()
            return true
        }
        func notify(_ style: Notice.Style, _ text: String) -> Bool { true }
        func ask(_ prompt: Prompt) -> PAMAnswer {
            let next: String?? = lock.withLock { s in
                s.prompts.append(prompt.purpose)
                return s.answers.isEmpty ? nil : s.answers.removeFirst()
            }
            guard let answer = next ?? nil else { return .cancel }
            return .answer(SecureBytes(copying: Array(answer.utf8)))
        }
    }

    /// A real vault in a temp dir; the gate's `LockoutStore` over it.
    final class Vault: LockoutStore, @unchecked Sendable {
        let directory = TestPaths.temporaryDirectory("kh-gate")
        let store: Mutex<VaultStore>
        init() throws {
            store = Mutex(try VaultStore.open(stateDirectory: directory + "/state", passwordHashing: .interactive))
        }
        deinit { try? FileManager.default.removeItem(atPath: directory) }
        /// As `Broker.withStore`: the store under its lock.
        func hold<R: Sendable>(_ body: (VaultStore) -> R) -> R { store.withLock { body($0) } }
        func lockout(uid: UInt32) -> Result<LockoutRecord, StoreError> { hold { $0.lockoutRecord(uid: uid) } }
        func updateLockout(uid: UInt32, _ change: (LockoutRecord) -> LockoutRecord?) -> Result<LockoutRecord, StoreError> {
            hold { $0.updateLockoutRecord(uid: uid, change) }
        }
        func checkAppPassword(_ item: StoredItem, _ key: AppPasswordKey) -> Result<Void, StoreError> {
            hold { $0.checkAppPassword(item, key) }
        }
        func failures(_ uid: UInt32 = uid) throws -> UInt32 { try store.withLock { try $0.lockout(uid: uid) }.failures }
        func sql(_ text: String) throws {
            let db = try Database(path: directory + "/state/vault.db")
            try db.execute(text)
            db.close()
        }
        func add(_ policy: String, service: String = "svc", reuse: UInt32 = 0, allowed: [String] = [],
                 appPassword: String? = nil) throws -> StoredItem {
            let access = AccessControl(policy: try Policy(parsing: policy), allowedExecutables: allowed, reuseSeconds: reuse)
            let record = AuditRecord(callerUID: uid, callerPID: 1, executable: "/t", operation: .put, service: service,
                                     account: "acct", decision: .granted, method: .none, reason: nil, outcome: .ok)
            return try store.withLock {
                try $0.add(owner: uid, NewItem(service: service, account: "acct", access: access),
                           secret: SecureBytes(copying: Array("the secret".utf8)),
                           appPassword: try appPassword.map { try AppPasswordKey.sealing(password: SecureBytes(copying: Array($0.utf8)), strength: .interactive) },
                           audit: record)
            }
        }
    }

    static let uid: UInt32 = 4242

    /// The three Keyhold stacks, all answering `module` (pam_permit or pam_deny).
    static func stacks(_ module: String) -> String {
        let dir = TestPaths.temporaryDirectory("kh-gate-pam")
        for name in ["keyhold", "keyhold-passcode", "keyhold-biometry"] {
            try? "auth required \(module)\naccount required pam_permit.so\n".write(toFile: dir + "/" + name, atomically: true, encoding: .utf8)
        }
        return dir
    }
    static let yes = stacks("pam_permit.so")
    static let no = stacks("pam_deny.so")
    /// pam_matrix asking for a password through the conversation, checked against a passdb
    /// named in the stack (never the process-wide PAM_MATRIX_PASSWD other suites set).
    static let asks: String = {
        let dir = TestPaths.temporaryDirectory("kh-gate-pam")
        try? "gate-test-user:right horse:keyhold-passcode\n".write(toFile: dir + "/passdb", atomically: true, encoding: .utf8)
        return stacks("\(PAMTestStacks.matrixModule) passdb=\(dir)/passdb")
    }()

    static func gate(_ stacks: String, clock: FakeClock = FakeClock(), prints: String? = nil) -> ReleaseGate {
        let noPrints = prints ?? TestPaths.temporaryDirectory("kh-gate-prints")
        return ReleaseGate(authenticator: PAMAuthenticator(helperExecutable: TestPaths.pamHelper, serviceDirectory: stacks, deadlineSeconds: 30),
                           fprintStateDirectory: noPrints, clock: clock)
    }

    static func caller(session: Int32 = 77, pid: Int32 = getpid(), startTime: UInt64 = 4242, socket: Int32 = -1, peer: Peer? = nil) -> Caller {
        var c = Caller(uid: uid, pid: pid, executable: CallerFacts.readExecutable(pid: getpid()) ?? "?", sessionID: session,
                       startTime: startTime, userName: "gate-test-user", tty: nil, remoteHost: nil)
        c.socket = socket
        c.peer = peer
        return c
    }

    static func request(interactive: Bool = true) -> Request {
        var r = Request(.get, item: ItemReference(service: "svc", account: "acct"))
        r.allowInteraction = interactive
        return r
    }

    static func outcome(_ r: Result<Authorization, Denial>) -> Outcome {
        switch r {
        case .success: .ok
        case .failure(let d): d.outcome
        }
    }

    static func method(_ r: Result<Authorization, Denial>) -> [AuthMethod.Factor]? {
        if case .success(let a) = r { a.wipe(); return a.method.factors }
        return nil
    }

    // MARK: policies

    @Test func policyNoneIsGrantedWithoutPromptOrPAM() throws {
        let vault = try Vault(), script = Script()
        let item = try vault.add("none")
        let r = Self.gate(Self.no).authorize(item, caller: Self.caller(), request: Self.request(), via: script, store: vault)
        #expect(Self.method(r) == [])
        #expect(script.announced == 0)
        #expect(try vault.failures() == 0)
    }

    @Test func passcodeSucceedsThroughPAMAndFailsThroughPAM() throws {
        let vault = try Vault()
        let item = try vault.add("device-passcode")
        let ok = Script()
        #expect(Self.method(Self.gate(Self.yes).authorize(item, caller: Self.caller(), request: Self.request(), via: ok, store: vault)) == [.password])
        #expect(ok.announced == 1)
        #expect(try vault.failures() == 0)
        let bad = Script()
        guard case .failure(let d) = Self.gate(Self.no).authorize(item, caller: Self.caller(), request: Self.request(), via: bad, store: vault) else {
            Issue.record("pam_deny granted"); return
        }
        // PAM's own "no" (a helper that failed would say so in the detail).
        #expect(d.outcome == .authenticationFailed && d.detail == nil)
        #expect(try vault.failures() == 1)
    }

    @Test func pamPromptsGoThroughTheConversation() throws {
        let vault = try Vault()
        let item = try vault.add("device-passcode")
        let right = Script(answers: ["right horse"])
        #expect(Self.method(Self.gate(Self.asks).authorize(item, caller: Self.caller(), request: Self.request(), via: right, store: vault)) == [.password])
        #expect(right.prompts == [.authentication])
        let wrong = Script(answers: ["wrong horse"])
        #expect(Self.outcome(Self.gate(Self.asks).authorize(item, caller: Self.caller(), request: Self.request(), via: wrong, store: vault)) == .authenticationFailed)
        // Asked once more (a mistyped password's retry); no second answer: the one failure stands.
        #expect(wrong.prompts == [.authentication, .authentication])
        #expect(try vault.failures() == 1)
        // The person walks away at the prompt: canceled, and the attempt stays counted.
        let gone = Script(answers: [nil])
        #expect(Self.outcome(Self.gate(Self.asks).authorize(item, caller: Self.caller(), request: Self.request(), via: gone, store: vault)) == .userCanceled)
        #expect(try vault.failures() == 2)
    }

    @Test func biometryNeedsEnrolledPrintsThenPAM() throws {
        let vault = try Vault()
        let item = try vault.add("biometry-any")
        let none = Script()
        let denied = Self.gate(Self.yes).authorize(item, caller: Self.caller(), request: Self.request(), via: none, store: vault)
        #expect(Self.outcome(denied) == .authenticationFailed)
        #expect(none.announced == 0)  // refused before any prompt or count
        #expect(try vault.failures() == 0)
        // fprintd's layout: <state>/<user>/<device>/<finger>.
        let prints = TestPaths.temporaryDirectory("kh-gate-prints")
        try FileManager.default.createDirectory(atPath: prints + "/gate-test-user/virtual_image/0", withIntermediateDirectories: true)
        try "template".write(toFile: prints + "/gate-test-user/virtual_image/0/7", atomically: true, encoding: .utf8)
        let enrolled = Script()
        let r = Self.gate(Self.yes, prints: prints).authorize(item, caller: Self.caller(), request: Self.request(), via: enrolled, store: vault)
        #expect(Self.method(r) == [.fingerprint])
        #expect(enrolled.announced == 1)
    }

    /// A caller the kernel shows no session (0: the leader is outside its PID namespace, as in
    /// a container) has a window for its own process only; an unknown session has none.
    @Test func reuseWithoutAVisibleSessionIsScopedToTheProcess() throws {
        let vault = try Vault(), clock = FakeClock()
        let item = try vault.add("device-passcode", reuse: 60)
        let gate = Self.gate(Self.yes, clock: clock)
        // Session 0 callers come with the connection's peer: a process window needs the two to agree.
        func inSessionZero(pid: Int32, startTime: UInt64) -> Caller {
            Self.caller(session: 0, pid: pid, startTime: startTime, peer: Peer(fd: -1, pid: pid, uid: Self.uid))
        }
        let agent = inSessionZero(pid: 500, startTime: 9000)
        #expect(Self.method(gate.authorize(item, caller: agent, request: Self.request(), via: Script(), store: vault)) == [.password])
        clock.advance(seconds: 10)
        #expect(Self.method(gate.authorize(item, caller: agent, request: Self.request(interactive: false), via: Script(), store: vault)) == [.reuse])
        // Another process in the same invisible session, or the same pid reused later: no window.
        #expect(gate.preview(item, caller: inSessionZero(pid: 501, startTime: 9000)) == .requiresAuthentication)
        #expect(gate.preview(item, caller: inSessionZero(pid: 500, startTime: 9700)) == .requiresAuthentication)
        // Nor the program that process execs into: same pid and start time, another executable.
        var execed = inSessionZero(pid: 500, startTime: 9000)
        execed = Caller(uid: execed.uid, pid: 500, executable: "/usr/bin/another-program", sessionID: 0,
                        startTime: 9000, userName: "gate-test-user", tty: nil, remoteHost: nil)
        execed.peer = Peer(fd: -1, pid: 500, uid: Self.uid)
        #expect(gate.preview(item, caller: execed) == .requiresAuthentication)
        #expect(gate.preview(item, caller: inSessionZero(pid: 500, startTime: 9000)) == .available, "the same program keeps it")
        // Nor does a caller in a real session with that number, or one whose session is unknown.
        #expect(gate.preview(item, caller: Self.caller(session: 500)) == .requiresAuthentication)
        // A request not tied to that process (sent on a connection another process made, or
        // by several processes) does not use its window.
        var relayed = Self.caller(session: 0, pid: 500, startTime: 9000, peer: Peer(fd: -1, pid: 77_777, uid: Self.uid))
        #expect(gate.preview(item, caller: relayed) == .requiresAuthentication)
        relayed = inSessionZero(pid: 500, startTime: 9000)
        relayed.identityProblem = "the request was sent by more than one process"
        #expect(gate.preview(item, caller: relayed) == .requiresAuthentication)
        let unknown = Self.caller(session: -1, pid: 500, startTime: 9000)
        #expect(Self.method(gate.authorize(item, caller: unknown, request: Self.request(), via: Script(), store: vault)) == [.password])
        #expect(Self.outcome(gate.authorize(item, caller: unknown, request: Self.request(interactive: false), via: Script(), store: vault)) == .interactionNotAllowed)
    }

    @Test func reuseWindowEndsWithTheClock() throws {
        let vault = try Vault(), clock = FakeClock()
        let item = try vault.add("device-passcode", reuse: 60)
        let gate = Self.gate(Self.yes, clock: clock)
        let first = Script()
        #expect(Self.method(gate.authorize(item, caller: Self.caller(), request: Self.request(), via: first, store: vault)) == [.password])
        clock.advance(seconds: 59)
        let within = Script()
        #expect(Self.method(gate.authorize(item, caller: Self.caller(), request: Self.request(interactive: false), via: within, store: vault)) == [.reuse])
        #expect(within.announced == 0)
        #expect(gate.preview(item, caller: Self.caller()) == .available)
        // Another login session of the same uid has no window.
        #expect(gate.preview(item, caller: Self.caller(session: 78)) == .requiresAuthentication)
        clock.advance(seconds: 2)
        #expect(gate.preview(item, caller: Self.caller()) == .requiresAuthentication)
        let after = Script()
        #expect(Self.outcome(gate.authorize(item, caller: Self.caller(), request: Self.request(interactive: false), via: after, store: vault)) == .interactionNotAllowed)
    }

    /// A window is the uid's that opened it: another account in the same session (`su`
    /// without a new session), or the same process after it changed uid, has none.
    @Test func reuseWindowIsNotSharedAcrossAccounts() throws {
        let vault = try Vault(), clock = FakeClock()
        let item = try vault.add("device-passcode", reuse: 60)
        let gate = Self.gate(Self.yes, clock: clock)
        #expect(Self.method(gate.authorize(item, caller: Self.caller(), request: Self.request(), via: Script(), store: vault)) == [.password])
        #expect(gate.preview(item, caller: Self.caller()) == .available)
        func asOther(session: Int32) -> Caller {
            var c = Caller(uid: Self.uid + 1, pid: getpid(), executable: Self.caller().executable, sessionID: session,
                           startTime: 4242, userName: "gate-test-other", tty: nil, remoteHost: nil)
            c.peer = Peer(fd: -1, pid: getpid(), uid: Self.uid + 1)
            return c
        }
        #expect(gate.preview(item, caller: asOther(session: 77)) == .requiresAuthentication)
        #expect(Self.outcome(gate.authorize(item, caller: asOther(session: 77), request: Self.request(interactive: false), via: Script(), store: vault)) == .interactionNotAllowed)
        // The same in a session the kernel does not show (a window for the process alone).
        let own = Self.caller(session: 0, peer: Peer(fd: -1, pid: getpid(), uid: Self.uid))
        #expect(Self.method(gate.authorize(item, caller: own, request: Self.request(), via: Script(), store: vault)) == [.password])
        #expect(gate.preview(item, caller: own) == .available)
        #expect(gate.preview(item, caller: asOther(session: 0)) == .requiresAuthentication)
    }
}
