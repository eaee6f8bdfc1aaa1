import Foundation
import Glibc
import Testing
import KeyholdClient
import KeyholdCore
import KeyholdVault
import KeyholdTestSupport

/// Issue 3: release only after a real PAM authentication run by the broker (real libpam,
/// pam_matrix test stacks from pam/test, the real broker over its socket).
@Suite(.serialized) struct PAMGateTests {
    let right = "right-password"

    func gatedFixture(_ extra: [String: String] = [:]) throws -> BrokerFixture {
        try BrokerFixture(passwords: ["root": right].merging(extra) { a, _ in a })
    }

    @Test func rightWrongCanceledAndAudited() throws {
        let b = try gatedFixture()
        #expect(b.cli(["put", "mail", "me", "--policy", "device-passcode"], stdin: Array("s3cr3t".utf8)).status == 0)
        let ok = b.cli(["get", "mail", "me", "--reason", "sync mail"], environment: ["KEYHOLD_ASKPASS": b.askpass(answering: right)])
        #expect(ok.status == 0, "\(ok.stderr)")
        expectSecret(ok.stdoutText, equals: "s3cr3t")
        // Before any prompt, the broker names the requesting program and the reason.
        #expect(ok.stderr.contains("keyhold: mail / me requested, reason: sync mail\nkeyhold: by \(TestPaths.keyhold) (pid "), "\(ok.stderr)")

        let wrong = b.cli(["get", "mail", "me"], environment: ["KEYHOLD_ASKPASS": b.askpass(answering: "nope", name: "wrong")])
        #expect(wrong.status == 6 && wrong.stdout.isEmpty)

        let cancel = b.cli(["get", "mail", "me"], environment: ["KEYHOLD_ASKPASS": b.askpass(answering: nil, name: "cancel")])
        #expect(cancel.status == 5 && cancel.stdout.isEmpty)

        let audit = b.cli(["audit", "--json", "--item", "mail/me"])
        let rows = audit.stdoutText.split(separator: "\n").compactMap { try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] }
        let gets = rows.filter { $0["operation"] as? String == "get" }
        #expect(gets.count == 3)
        #expect(gets.first?["method"] as? String == "password" && gets.first?["decision"] as? String == "granted")
        #expect(gets.first?["reason"] as? String == "sync mail")
        #expect(gets.dropFirst().first?["outcome"] as? String == "authentication-failed")
        #expect(gets.last?["outcome"] as? String == "user-canceled")
        #expect(!audit.stdoutText.contains("s3cr3t") && !audit.stdoutText.contains(right))
    }

    @Test func noInteractionNeverReachesThePasswordModule() throws {
        let probe = try BrokerFixture()
        probe.stop()
        let marker = probe.directory + "/pam-was-called"
        let b = try BrokerFixture(passwords: ["root": right], pamDirectory: try probe.pamDirectoryWithMarker(marker))
        #expect(b.cli(["put", "gated", "x", "--policy", "user-presence"], stdin: Array("v".utf8)).status == 0)
        #expect(b.cli(["put", "open", "x"], stdin: Array("free".utf8)).status == 0)

        let flag = b.cli(["get", "gated", "x", "--no-interaction"], environment: ["KEYHOLD_ASKPASS": b.askpass(answering: right)])
        #expect(flag.status == 7 && flag.stdout.isEmpty)
        let noTTY = b.cli(["get", "gated", "x"])        // setsid: no terminal, no askpass
        #expect(noTTY.status == 7)
        #expect(!FileManager.default.fileExists(atPath: marker))
        // `none` items need no prompt at all.
        expectSecret(b.cli(["get", "open", "x", "--no-interaction"]).stdoutText, equals: "free")
        #expect(!FileManager.default.fileExists(atPath: marker))
        // The marker does work: an interactive get runs the stack.
        #expect(b.cli(["get", "gated", "x"], environment: ["KEYHOLD_ASKPASS": b.askpass(answering: right)]).status == 0)
        #expect(FileManager.default.fileExists(atPath: marker))
    }

    /// PAM sees the kernel-verified caller: PAM_USER and PAM_RUSER from SO_PEERCRED's uid (never
    /// a client-sent name), PAM_TTY only when the caller has a terminal, no PAM_RHOST locally.
    @Test func pamItemsComeFromWhatTheBrokerVerified() throws {
        let user = try TestUser()
        let probe = try BrokerFixture()
        probe.stop()
        let log = probe.directory + "/pam-items"
        let b = try BrokerFixture(passwords: ["root": right, user.name: "user-password"],
                                  pamDirectory: try probe.pamDirectoryLoggingItems(to: log))
        #expect(b.cli(["put", "p", "x", "--policy", "device-passcode"], stdin: [1], asUser: user.name).status == 0)
        #expect(b.cli(["get", "p", "x"], environment: ["KEYHOLD_ASKPASS": b.askpass(answering: "user-password"), "USER": "root",
                                                          "LOGNAME": "root", "PAM_USER": "root"], asUser: user.name).status == 0)
        let items = try String(contentsOfFile: log, encoding: .utf8).split(separator: "\n").map(String.init)
        #expect(items.contains("PAM_USER=\(user.name)"), "\(items)")
        #expect(items.contains("PAM_RUSER=\(user.name)"))
        #expect(items.contains("PAM_SERVICE=keyhold-passcode"))
        #expect(!items.contains { $0.hasPrefix("PAM_TTY=") })     // setsid: no terminal
        #expect(!items.contains { $0.hasPrefix("PAM_RHOST=") })
    }

    @Test func reuseWindowHonouredExpiredAndLocked() throws {
        let b = try gatedFixture()
        // One grant, two windows: "r" reads within its 60 s (which no loaded machine outlasts),
        // "short" only within 2 s of the same grant, so past 2.5 s it needs a new answer.
        #expect(b.cli(["put", "r", "x", "--policy", "device-passcode", "--reuse", "60"], stdin: Array("rv".utf8)).status == 0)
        #expect(b.cli(["put", "short", "x", "--policy", "device-passcode", "--reuse", "2"], stdin: Array("sv".utf8)).status == 0)
        #expect(b.cli(["put", "noreuse", "x", "--policy", "device-passcode"], stdin: Array("nv".utf8)).status == 0)
        let ask = b.askpass(answering: right)
        let r = b.script("""
            KEYHOLD_ASKPASS=\(ask) KH get r x >/dev/null; echo "first=$?"
            KH get r x --no-interaction >/dev/null; echo "within=$?"
            KH state r x
            KH get noreuse x --no-interaction >/dev/null; echo "other-item=$?"
            sleep 2.5
            KH get short x --no-interaction >/dev/null; echo "expired=$?"
            KEYHOLD_ASKPASS=\(ask) KH get r x >/dev/null; echo "again=$?"
            KH lock; echo "lock=$?"
            KH get r x --no-interaction >/dev/null; echo "after-lock=$?"
            """)
        #expect(r.stdoutText == "first=0\nwithin=0\navailable\nother-item=7\nexpired=7\nagain=0\nlock=0\nafter-lock=7\n", "\(r.stdoutText) \(r.stderr)")
        // Another login session does not inherit the window.
        #expect(b.cli(["get", "r", "x", "--no-interaction"]).status == 7)
        let methods = b.cli(["audit", "--json", "--item", "r/x"]).stdoutText
        #expect(methods.contains("\"method\":\"reuse\""))
    }

    /// Where the kernel shows the caller no session (its leader is outside the broker's PID
    /// namespace, as in CI's container and under `unshare --pid`), a window belongs to the
    /// program that authenticated: the same process asks again without a prompt, the program
    /// it execs into (same pid, same start time) does not. In a visible session the window is
    /// the session's, so the exec'd program reads it (SECURITY.md, "Reuse windows"). The client
    /// answers the prompt itself over the wire (Tests/fixtures/hostile_client.py, reuseexec)
    /// and is spawned in the test runner's session (Process would give it a session of its own).
    @Test func aProgramExecedIntoDoesNotInheritAProcessWindow() throws {
        let b = try gatedFixture()
        #expect(b.cli(["put", "r", "x", "--policy", "device-passcode", "--reuse", "60"], stdin: Array("rv".utf8)).status == 0)
        let answer = b.directory + "/reuseexec-answer", log = b.directory + "/reuseexec-out"
        #expect(FileManager.default.createFile(atPath: answer, contents: Data((right + "\n").utf8), attributes: [.posixPermissions: 0o600]))
        let client = try SpawnedProcess.spawn("/usr/bin/python3", [HostileLocalUserTests.client, "reuseexec", b.socketPath, "r", "x",
                                                                   TestPaths.keyhold], environment: [:], log: log, stdin: answer)
        #expect(client.waitForExit(timeout: 60))
        let output = (try? String(contentsOfFile: log, encoding: .utf8)) ?? ""
        let lines = output.split(separator: "\n", maxSplits: 1, omittingEmptySubsequences: false)
        let json = (try? JSONSerialization.jsonObject(with: Data((lines.first ?? "").utf8))) as? [String: Any] ?? [:]
        #expect(json["first"] as? String == "ok" && json["again"] as? String == "ok", "\(lines.first ?? "")")
        let after = lines.count > 1 ? String(lines[1]) : ""
        let entries = b.cli(["audit", "--json", "--item", "r/x"]).stdoutText.split(separator: "\n")
        let last = (try? JSONSerialization.jsonObject(with: Data((entries.last ?? "").utf8))) as? [String: Any] ?? [:]
        #expect(last["pid"] as? Int == json["pid"] as? Int && last["executable"] as? String == TestPaths.keyhold, "\(last)")
        if json["session"] as? Int == 0 {
            // Only the error line may follow the JSON line (a released secret is not printed here).
            #expect(client.exitCode == 7 && after.hasPrefix("keyhold: "), "exit \(String(describing: client.exitCode)), \(after.utf8.count) bytes after")
            #expect(last["outcome"] as? String == "interaction-not-allowed", "\(last)")
        } else {
            #expect(client.exitCode == 0, "exit \(String(describing: client.exitCode)), \(after.utf8.count) bytes after")
            expectSecret(after, equals: "rv")
            #expect(last["method"] as? String == "reuse", "\(last)")
        }
    }

    @Test func allowedExecutableAdmitsOnlyThatProgram() throws {
        let b = try gatedFixture()
        let copy = b.directory + "/other-client"
        try copyProgram(TestPaths.keyhold, to: copy)
        #expect(b.cli(["put", "pinned", "x", "--allow-exe", TestPaths.keyhold], stdin: Array("pv".utf8)).status == 0)
        expectSecret(b.cli(["get", "pinned", "x"]).stdoutText, equals: "pv")
        let other = runCommand(copy, ["--socket", b.socketPath, "get", "pinned", "x"], environment: ["KEYHOLD_ASKPASS": b.askpass(answering: right)])
        #expect(other.status == 10 && other.stdout.isEmpty)
        let relative = b.cli(["put", "p2", "x", "--allow-exe", "bin/git"], stdin: [1])
        #expect(relative.status == 2)
    }

    @Test func lockoutEscalatesAndPersists() throws {
        let b = try gatedFixture()
        #expect(b.cli(["put", "l", "x", "--policy", "device-passcode"], stdin: Array("lv".utf8)).status == 0)
        let wrong = ["KEYHOLD_ASKPASS": b.askpass(answering: "bad", name: "bad")]
        let good = ["KEYHOLD_ASKPASS": b.askpass(answering: right, name: "good")]
        for i in 1...5 { #expect(b.cli(["get", "l", "x"], environment: wrong).status == 6, "failure \(i)") }
        let locked = b.cli(["get", "l", "x"], environment: good)
        #expect(locked.status == 9 && locked.stdout.isEmpty)
        let state = b.cli(["state", "l", "x"])
        #expect(state.stderr.contains("locked out for"))
        let left = Int(state.stderr.split(separator: " ").first(where: { Int($0) != nil }) ?? "") ?? 0
        #expect(left > 50 && left <= 60)

        // A restart does not reset it.
        b.stop()
        try b.start()
        #expect(b.cli(["get", "l", "x"], environment: good).status == 9)

        // Once it expires (moved into the past on disk), the next failure locks for twice as long.
        b.stop()
        let db = try Database(path: b.stateDirectory + "/vault.db")
        try db.execute("UPDATE lockout SET locked_until_us = 1")
        db.close()
        try b.start()
        #expect(b.cli(["get", "l", "x"], environment: wrong).status == 6)
        let left2 = Int(b.cli(["state", "l", "x"]).stderr.split(separator: " ").first(where: { Int($0) != nil }) ?? "") ?? 0
        #expect(left2 > 110 && left2 <= 120)

        // A success after expiry resets the count.
        b.stop()
        let db2 = try Database(path: b.stateDirectory + "/vault.db")
        try db2.execute("UPDATE lockout SET locked_until_us = 1")
        db2.close()
        try b.start()
        #expect(b.cli(["get", "l", "x"], environment: good).status == 0)
        #expect(b.cli(["get", "l", "x"], environment: wrong).status == 6)
        #expect(b.cli(["get", "l", "x"], environment: good).status == 0)
    }

    @Test func appPasswordRightWrongAndNotAloneEnough() throws {
        let b = try gatedFixture()
        let put = b.cli(["put", "ap", "x", "--policy", "device-passcode+app-password"], stdin: Array("apv".utf8),
                        environment: ["KEYHOLD_ASKPASS": b.askpass(password: right, appPassword: "item-pw", name: "put")])
        #expect(put.status == 0, "\(put.stderr)")
        let both = b.cli(["get", "ap", "x"], environment: ["KEYHOLD_ASKPASS": b.askpass(password: right, appPassword: "item-pw", name: "both")])
        #expect(both.status == 0, "\(both.stderr)")
        expectSecret(both.stdoutText, equals: "apv")
        let wrongApp = b.cli(["get", "ap", "x"], environment: ["KEYHOLD_ASKPASS": b.askpass(password: right, appPassword: "nope", name: "wa")])
        #expect(wrongApp.status == 6 && wrongApp.stdout.isEmpty)
        let wrongPAM = b.cli(["get", "ap", "x"], environment: ["KEYHOLD_ASKPASS": b.askpass(password: "bad", appPassword: "item-pw", name: "wp")])
        #expect(wrongPAM.status == 6 && wrongPAM.stdout.isEmpty)
        #expect(b.cli(["get", "ap", "x", "--no-interaction"]).status == 7)
        let audit = b.cli(["audit", "--json", "--item", "ap/x"]).stdoutText
        #expect(audit.contains("\"method\":\"password+app-password\""))
        #expect(!audit.contains("item-pw") && !audit.contains(right))
    }

    /// `rotate` passes the same gate as `get`: a reuse window granted by a `get` covers it (and
    /// `keyhold lock` ends that), and an application-password item needs both answers, a wrong
    /// one refusing before COMMAND sees anything.
    @Test func rotateHonoursTheReuseWindowAndTheApplicationPassword() throws {
        let b = try gatedFixture()
        let marker = b.directory + "/ran"
        #expect(b.cli(["put", "rw", "x", "--policy", "device-passcode", "--reuse", "60"], stdin: Array("r1".utf8)).status == 0)
        let ask = b.askpass(answering: right)
        let r = b.script("""
            KEYHOLD_ASKPASS=\(ask) KH get rw x >/dev/null; echo "get=$?"
            KH rotate rw x --no-interaction -- /bin/sh -c 'cat >/dev/null; printf r2'; echo "within=$?"
            KH lock; echo "lock=$?"
            KH rotate rw x --no-interaction -- /bin/sh -c 'touch \(marker); printf r3'; echo "after-lock=$?"
            """)
        #expect(r.stdoutText == "get=0\nwithin=0\nlock=0\nafter-lock=7\n", "\(r.stdoutText) \(r.stderr)")
        #expect(!FileManager.default.fileExists(atPath: marker), "COMMAND never ran once the window was closed")
        let audit = b.cli(["audit", "--json", "--item", "rw/x"]).stdoutText
        #expect(audit.contains("\"method\":\"reuse\""), "\(audit)")

        let put = b.cli(["put", "ap", "x", "--policy", "device-passcode+app-password"], stdin: Array("a1".utf8),
                        environment: ["KEYHOLD_ASKPASS": b.askpass(password: right, appPassword: "item-pw", name: "ap-put")])
        #expect(put.status == 0, "\(put.stderr)")
        let wrongApp = b.cli(["rotate", "ap", "x", "--", "/bin/sh", "-c", "touch \(marker); printf a2"],
                             environment: ["KEYHOLD_ASKPASS": b.askpass(password: right, appPassword: "nope", name: "ap-wrong")])
        #expect(wrongApp.status == 6, "\(wrongApp.stderr)")
        #expect(!FileManager.default.fileExists(atPath: marker), "COMMAND never saw the secret after a wrong item password")
        let both = b.cli(["rotate", "ap", "x", "--print", "--", "/bin/sh", "-c", "cat >/dev/null; printf a2"],
                         environment: ["KEYHOLD_ASKPASS": b.askpass(password: right, appPassword: "item-pw", name: "ap-both")])
        #expect(both.status == 0, "\(both.stderr)")
        expectSecret(both.stdoutText, equals: "a2")
        let read = b.cli(["get", "ap", "x"], environment: ["KEYHOLD_ASKPASS": b.askpass(password: right, appPassword: "item-pw", name: "ap-get")])
        #expect(read.status == 0, "\(read.stderr)")
        expectSecret(read.stdoutText, equals: "a2", "the new secret is sealed under the same item password")
        #expect(!b.cli(["audit", "--json", "--item", "ap/x"]).stdoutText.contains("item-pw"))
    }

    @Test func changingThePolicyNeedsTheOldOne() throws {
        let b = try gatedFixture()
        #expect(b.cli(["put", "c", "x", "--policy", "device-passcode"], stdin: Array("old".utf8)).status == 0)
        let noAuth = b.cli(["put", "c", "x", "--update", "--policy", "none"], stdin: Array("new".utf8))
        #expect(noAuth.status == 7)
        let wrong = b.cli(["put", "c", "x", "--update", "--policy", "none"], stdin: Array("new".utf8),
                          environment: ["KEYHOLD_ASKPASS": b.askpass(answering: "bad", name: "bad")])
        #expect(wrong.status == 6)
        expectSecret(b.cli(["get", "c", "x"], environment: ["KEYHOLD_ASKPASS": b.askpass(answering: right)]).stdoutText, equals: "old")
        let ok = b.cli(["put", "c", "x", "--update", "--policy", "none"], stdin: Array("new".utf8),
                       environment: ["KEYHOLD_ASKPASS": b.askpass(answering: right)])
        #expect(ok.status == 0)
        expectSecret(b.cli(["get", "c", "x", "--no-interaction"]).stdoutText, equals: "new")
    }

    @Test func biometricPoliciesWithoutAReaderFailClearly() throws {
        let b = try gatedFixture()
        for p in ["biometry-any", "user-presence", "biometry-any or device-passcode"] {
            #expect(b.cli(["put", p, "x", "--policy", p], stdin: Array("bv".utf8)).status == 0)
        }
        let bio = b.cli(["get", "biometry-any", "x"], environment: ["KEYHOLD_ASKPASS": b.askpass(answering: right)])
        #expect(bio.status == 6 && bio.stderr.contains("no finger is enrolled"))
        // user-presence falls back to the password when no finger is enrolled.
        expectSecret(b.cli(["get", "user-presence", "x"], environment: ["KEYHOLD_ASKPASS": b.askpass(answering: right)]).stdoutText, equals: "bv")
        expectSecret(b.cli(["get", "biometry-any or device-passcode", "x"], environment: ["KEYHOLD_ASKPASS": b.askpass(answering: right)]).stdoutText, equals: "bv")
        // biometry-current-set cannot be stored without an enrolled set to bind to.
        let cs = b.cli(["put", "cs", "x", "--policy", "biometry-current-set"], stdin: [1])
        #expect(cs.status == 6 && cs.stderr.contains("no finger is enrolled"))
        for bad in ["device-passcode or", "biometry-any or device-passcode and user-presence", "none or device-passcode", "passcode"] {
            let r = b.cli(["put", "bad", "x", "--policy", bad], stdin: [1])
            #expect(r.status == 2, "\(bad)")
        }
    }

    @Test func anotherUserCannotReachRootsItems() throws {
        let user = try TestUser()
        let b = try BrokerFixture(passwords: ["root": right, user.name: "user-password"])
        #expect(b.cli(["put", "root-only", "x", "--policy", "device-passcode"], stdin: Array("root-secret".utf8)).status == 0)
        #expect(b.cli(["put", "root-open", "x"], stdin: Array("root-open-secret".utf8)).status == 0)
        let ask = b.askpass(answering: right, name: "rootpw")
        chmod(ask, 0o755)
        // Scoped by the kernel-verified uid: root's items do not exist for the user.
        let r1 = b.cli(["get", "root-open", "x"], asUser: user.name)
        #expect(r1.status == 3 && r1.stdout.isEmpty, "\(r1.stderr)")
        #expect(b.cli(["get", "root-only", "x"], environment: ["KEYHOLD_ASKPASS": ask], asUser: user.name).status == 3)
        #expect(b.cli(["state", "root-open", "x"], asUser: user.name).stdoutText == "not-found\n")
        #expect(!b.cli(["ls"], asUser: user.name).stdoutText.contains("root-"))
        // The user's own gated item: its own password works, root's does not.
        #expect(b.cli(["put", "mine", "x", "--policy", "device-passcode"], stdin: Array("user-secret".utf8), asUser: user.name).status == 0)
        #expect(b.cli(["get", "mine", "x"], environment: ["KEYHOLD_ASKPASS": ask], asUser: user.name).status == 6)
        let own = b.askpass(answering: "user-password", name: "userpw")
        expectSecret(b.cli(["get", "mine", "x"], environment: ["KEYHOLD_ASKPASS": own], asUser: user.name).stdoutText, equals: "user-secret")
        // Root's own namespace does not see the user's item either.
        #expect(b.cli(["get", "mine", "x"]).status == 3)
        // The state directory itself is closed to the user.
        let peek = runCommand("/bin/ls", [b.stateDirectory], asUser: user.name)
        #expect(peek.status != 0)
        let cat = runCommand("/bin/cat", [b.stateDirectory + "/vault.key"], asUser: user.name)
        #expect(cat.status != 0 && cat.stdout.isEmpty)
    }

    /// 1,000 gets, failing and succeeding in turn, leave the broker's fds and memory flat.
    @Test func pamHandlesNeverLeak() throws {
        let b = try gatedFixture()
        let vault = Vault(socketPath: b.socketPath)
        try vault.add(SecureBytes(copying: Array("leak-check".utf8)), service: "leak", account: "x",
                      access: AccessControl(policy: Policy(constraints: [.devicePasscode])))
        let good = FixedAnswer(right), bad = FixedAnswer("wrong")
        func fds() -> Int { (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(b.pid)/fd").count) ?? -1 }
        func rssKiB() -> Int {
            let status = (try? String(contentsOfFile: "/proc/\(b.pid)/status", encoding: .utf8)) ?? ""
            let line = status.split(separator: "\n").first { $0.hasPrefix("VmRSS:") } ?? ""
            return Int(line.split(separator: " ").dropFirst().first ?? "") ?? -1
        }
        for i in 0..<50 { _ = try? vault.secret(service: "leak", account: "x", interaction: i % 2 == 0 ? bad : good) }
        // Connection threads close their sockets just after replying: read counts once settled.
        func settledFDs() -> Int {
            var last = fds()
            for _ in 0..<100 {
                usleep(20_000)
                let now = fds()
                if now == last { return now }
                last = now
            }
            return last
        }
        let fdsBefore = settledFDs(), rssBefore = rssKiB()
        var released = 0, refused = 0
        for i in 0..<1000 {
            do {
                _ = try vault.secret(service: "leak", account: "x", interaction: i % 2 == 0 ? bad : good)
                released += 1
            } catch { refused += 1 }
        }
        var fdsAfter = settledFDs()
        for _ in 0..<100 where fdsAfter > fdsBefore { usleep(20_000); fdsAfter = fds() }
        let rssAfter = rssKiB()
        print("pam loop: released \(released), refused \(refused); broker fds \(fdsBefore) -> \(fdsAfter), RSS \(rssBefore) -> \(rssAfter) KiB")
        #expect(released == 500 && refused == 500)
        #expect(fdsAfter <= fdsBefore)
        #expect(rssAfter - rssBefore < 8 * 1024)
    }
}

/// Answers every prompt with one fixed string (a test password, never a real secret).
final class FixedAnswer: Interaction {
    let text: String
    init(_ text: String) { self.text = text }
    func answer(_ prompt: Prompt) -> SecureBytes? { SecureBytes(copying: Array(text.utf8)) }
    func show(_ notice: Notice) {}
}
