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

/// The gate's lockout, application password and allowed executables, driven directly (the
/// scripted conversation and fake clock of ReleaseGateTests).
extension ReleaseGateTests {
    // MARK: lockout

    @Test func fiveFailuresLockOutThenEscalateAndPersist() throws {
        let vault = try Vault(), clock = FakeClock()
        let item = try vault.add("device-passcode")
        let gate = Self.gate(Self.no, clock: clock)
        for _ in 0..<5 {
            #expect(Self.outcome(gate.authorize(item, caller: Self.caller(), request: Self.request(), via: Script(), store: vault)) == .authenticationFailed)
        }
        let locked = Script()
        guard case .failure(let d) = gate.authorize(item, caller: Self.caller(), request: Self.request(), via: locked, store: vault) else {
            Issue.record("granted while locked out"); return
        }
        #expect(d.outcome == .lockedOut && d.secondsLeft == 60)
        #expect(locked.announced == 0)
        // A right answer does not help while locked out: the yes-gate is refused too.
        #expect(Self.outcome(Self.gate(Self.yes, clock: clock).authorize(item, caller: Self.caller(), request: Self.request(), via: Script(), store: vault)) == .lockedOut)
        clock.advance(seconds: 61)
        #expect(Self.outcome(gate.authorize(item, caller: Self.caller(), request: Self.request(), via: Script(), store: vault)) == .authenticationFailed)
        #expect(try gate.lockoutLeft(uid: Self.uid, store: vault).get() == 120)  // doubled
        // Persisted: a new gate (a restarted broker) over the vault reopened from disk.
        vault.store.withLock { $0.close() }
        let reopened = try VaultStore.open(stateDirectory: vault.directory + "/state", passwordHashing: .interactive)
        let record = try reopened.lockout(uid: Self.uid)
        reopened.close()
        #expect(record.failures == 6 && record.level == 2)
        #expect(record.lockedUntil == clock.microseconds() + 120 * 1_000_000)
    }

    @Test func attemptIsReservedBeforePAMSoAConcurrentOneIsBusy() throws {
        let vault = try Vault()
        let item = try vault.add("device-passcode")
        let gate = Self.gate(Self.yes)
        let inside = DispatchSemaphore(value: 0), proceed = DispatchSemaphore(value: 0)
        let first = Script()
        first.onAnnounce = { inside.signal(); proceed.wait() }
        let result = Mutex<[AuthMethod.Factor]?>(nil)
        let done = DispatchSemaphore(value: 0)
        Thread {
            let r = gate.authorize(item, caller: Self.caller(), request: Self.request(), via: first, store: vault)
            result.withLock { $0 = Self.method(r) }
            done.signal()
        }.start()
        inside.wait()
        // Counted as failed before PAM has run.
        #expect(try vault.failures() == 1)
        let second = Script()
        guard case .failure(let d) = gate.authorize(item, caller: Self.caller(), request: Self.request(), via: second, store: vault) else {
            Issue.record("second authentication was not refused"); proceed.signal(); return
        }
        #expect(d.outcome == .busy && d.detail == AuthenticationLedger.inProgress)
        #expect(second.announced == 0)
        proceed.signal()
        done.wait()
        #expect(result.withLock { $0 } == [.password])
        #expect(try vault.failures() == 0)  // given back on success
    }

    @Test func aLockoutRecordThatCannotBeWrittenRefusesBeforePAM() throws {
        let vault = try Vault()
        let item = try vault.add("device-passcode")
        try vault.sql("""
            CREATE TRIGGER lockout_fault_i BEFORE INSERT ON lockout BEGIN SELECT RAISE(ABORT, 'disk says no'); END;
            CREATE TRIGGER lockout_fault_u BEFORE UPDATE ON lockout BEGIN SELECT RAISE(ABORT, 'disk says no'); END;
            """)
        let script = Script()
        let r = Self.gate(Self.yes).authorize(item, caller: Self.caller(), request: Self.request(), via: script, store: vault)
        #expect(Self.outcome(r) == .auditUnavailable)
        #expect(script.announced == 0)  // PAM never ran
    }

    @Test func noInteractionNeverReachesPAMOrCounts() throws {
        let vault = try Vault()
        let item = try vault.add("device-passcode")
        let script = Script()
        let r = Self.gate(Self.yes).authorize(item, caller: Self.caller(), request: Self.request(interactive: false), via: script, store: vault)
        #expect(Self.outcome(r) == .interactionNotAllowed)
        #expect(script.announced == 0 && script.prompts.isEmpty)
        #expect(try vault.failures() == 0)
    }

    // MARK: application password

    @Test func appPasswordRightWrongMissing() throws {
        let vault = try Vault()
        let item = try vault.add("app-password", appPassword: "open sesame")
        let gate = Self.gate(Self.no)
        let right = Script(answers: ["open sesame"])
        guard case .success(let granted) = gate.authorize(item, caller: Self.caller(), request: Self.request(), via: right, store: vault) else {
            Issue.record("right app password refused"); return
        }
        #expect(granted.method.factors == [.appPassword])
        // What is granted is the derived key, and it opens the item.
        let opened = vault.hold { try? $0.openSecret(item, appPassword: granted.appPassword) }
        expectSecret(opened.map { Array($0.withUnsafeBytes { Array($0) }) }, equals: Array("the secret".utf8))
        granted.wipe()
        #expect(right.prompts == [.appPassword])
        let wrong = Script(answers: ["guess"])
        #expect(Self.outcome(gate.authorize(item, caller: Self.caller(), request: Self.request(), via: wrong, store: vault)) == .authenticationFailed)
        #expect(try vault.failures() == 1)  // a wrong app password is a counted guess
        let empty = Script(answers: [""])  // no Argon2id input at all: still a counted wrong guess
        #expect(Self.outcome(gate.authorize(item, caller: Self.caller(), request: Self.request(), via: empty, store: vault)) == .authenticationFailed)
        #expect(try vault.failures() == 2)
        let missing = Script(answers: [nil])
        #expect(Self.outcome(gate.authorize(item, caller: Self.caller(), request: Self.request(), via: missing, store: vault)) == .userCanceled)
        #expect(try vault.failures() == 2)
        let quiet = Script(answers: ["open sesame"])
        #expect(Self.outcome(gate.authorize(item, caller: Self.caller(), request: Self.request(interactive: false), via: quiet, store: vault)) == .interactionNotAllowed)
        #expect(quiet.prompts.isEmpty)
        #expect(gate.preview(item, caller: Self.caller()) == .requiresAuthentication)
    }

    // MARK: allowed executables

    @Test func allowedExecutablesAreCheckedAgainstTheVerifiedCaller() throws {
        let vault = try Vault()
        var fds: [Int32] = [-1, -1]
        #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &fds) == 0)
        defer { close(fds[0]); close(fds[1]) }
        let me = Self.caller(socket: fds[0], peer: Peer(fd: fds[0], pid: getpid(), uid: Self.uid))
        // This test process spawns other tests' children in parallel: between clone and exec a
        // child holds a copy of the socket, and the gate rightly refuses a connection held by
        // two processes. That state passes within milliseconds, so such a refusal is asked
        // again (bounded) until no child is mid-spawn; any other answer counts at once.
        func settled(_ item: StoredItem) -> Result<Authorization, Denial> {
            var r = Self.gate(Self.yes).authorize(item, caller: me, request: Self.request(), via: Script(), store: vault)
            for _ in 0..<100 {
                guard case .failure(let d) = r, d.detail?.hasPrefix("the connection is held by") == true else { break }
                usleep(20_000)
                r = Self.gate(Self.yes).authorize(item, caller: me, request: Self.request(), via: Script(), store: vault)
            }
            return r
        }
        let other = try vault.add("none", service: "other", allowed: ["/usr/bin/not-this-program"])
        guard case .failure(let d) = settled(other) else {
            Issue.record("another program's item was granted"); return
        }
        #expect(d.outcome == .notAuthorized && d.detail == "this program may not read the item")
        // A caller that cannot be tied to the process that connected is refused as well.
        #expect(Self.outcome(Self.gate(Self.yes).authorize(other, caller: Self.caller(), request: Self.request(), via: Script(), store: vault)) == .notAuthorized)
        let mine = try vault.add("none", service: "mine", allowed: [me.executable])
        #expect(Self.method(settled(mine)) == [])
    }
}
