import Foundation
import Glibc
import Testing
import KeyholdCore
import KeyholdTestSupport

/// Issue 36 item 1: one refresh token is redeemed once, whatever dies. A rotation is cut off
/// 0.8 s in (keyhold killed with SIGKILL or SIGTERM, or the broker killed with SIGKILL and
/// restarted at once) while its COMMAND sleeps 2 s before redeeming; a second rotate starts at
/// once. The old token must be redeemed exactly once in all, and the item must end at a token a
/// COMMAND produced and that was committed.
@Suite(.serialized) struct RotationCutOffTests {
    /// The first rotation's `--timeout`: its lease is kept until about this + 5 s after release.
    static let firstTimeout = 4
    /// The second's: shorter than what is left of the first's lease, which it still waits out.
    static let secondTimeout = 6

    enum Cut { case killCLI, terminateCLI, killBroker }

    /// COMMAND: logs its start; a child of it (as curl would be) sleeps 2 s, then "redeems" the
    /// token (a line in `redeemed`: old token, new token) and prints the new one. That child
    /// must die with the rotation too, not only COMMAND.
    func command(_ dir: String) throws -> String {
        let path = dir + "/redeem.sh"
        let body = """
            #!/bin/sh
            old=$(cat)
            echo "$$ $(date +%s%3N)" >> \(dir)/started
            /bin/sh -c 'sleep 2; new="tok-$$-$(date +%s%N)"; echo "$1 $new" >> "$2"; printf %s "$new"' redeem "$old" \(dir)/redeemed
            exit $?
            """
        try body.write(toFile: path, atomically: true, encoding: .utf8)
        chmod(path, 0o755)
        return path
    }

    func lines(_ path: String) -> [String] {
        ((try? String(contentsOfFile: path, encoding: .utf8)) ?? "").split(separator: "\n").map(String.init)
    }

    /// `keyhold rotate` as its own process (not under a shell), so a signal reaches keyhold itself.
    func startRotate(_ b: BrokerFixture, _ command: String, timeout: Int, log: String) throws -> Process {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: TestPaths.keyhold)
        p.arguments = ["--socket", b.socketPath, "rotate", "idp", "me", "--no-interaction", "--timeout", String(timeout), "--", command]
        FileManager.default.createFile(atPath: log, contents: nil)
        let out = FileHandle(forWritingAtPath: log)
        p.standardOutput = out
        p.standardError = out
        p.standardInput = FileHandle.nullDevice
        try p.run()
        return p
    }

    func waitFor(_ seconds: Double, _ condition: () -> Bool) -> Bool {
        let end = Date().addingTimeInterval(seconds)
        while Date() < end {
            if condition() { return true }
            usleep(20_000)
        }
        return condition()
    }

    func cutOff(_ cut: Cut) throws {
        let b = try BrokerFixture()
        let dir = b.directory
        #expect(b.cli(["put", "idp", "me", "--kind", "refresh-token"], stdin: Array("tok-0".utf8)).status == 0)
        let cmd = try command(dir)
        let launched = Date()
        let first = try startRotate(b, cmd, timeout: Self.firstTimeout, log: dir + "/first.log")
        // Cut 0.8 s in, once COMMAND has the secret (it sleeps 2 s before redeeming).
        #expect(waitFor(30) { !lines(dir + "/started").isEmpty }, "the first COMMAND started")
        let cutAt = launched.addingTimeInterval(0.8)
        if Date() < cutAt { usleep(UInt32(cutAt.timeIntervalSinceNow * 1_000_000)) }
        switch cut {
        case .killCLI: kill(first.processIdentifier, SIGKILL)
        case .terminateCLI: kill(first.processIdentifier, SIGTERM)
        case .killBroker:
            b.kill9()
            try b.start()
        }
        let second = b.cli(["rotate", "idp", "me", "--no-interaction", "--timeout", String(Self.secondTimeout), "--", cmd])
        first.waitUntilExit()
        let firstLog = lines(dir + "/first.log").joined(separator: " | ")
        switch cut {
        case .killCLI: #expect(first.terminationReason == .uncaughtSignal && first.terminationStatus == SIGKILL)
        case .terminateCLI: #expect(first.terminationReason == .exit && first.terminationStatus == 5, "\(firstLog)")
        case .killBroker:
            #expect(first.terminationStatus == 1 && firstLog.contains("the broker's connection ended"), "\(first.terminationStatus) \(firstLog)")
        }
        #expect(second.status == 0, "\(second.stderr)")
        // Had the first COMMAND survived, it would have redeemed by now (2 s after its start).
        let started = lines(dir + "/started")
        let firstStarted = Double(started.first?.split(separator: " ").last ?? "") ?? 0
        #expect(waitFor(5) { Date().timeIntervalSince1970 * 1000 > firstStarted + 3_000 })

        let redeemed = lines(dir + "/redeemed").map { $0.split(separator: " ").map(String.init) }
        let ofOld = redeemed.filter { $0.first == "tok-0" }
        #expect(ofOld.count == 1, "the old token was redeemed once: \(redeemed)")
        #expect(redeemed.count == 1 && started.count == 2, "one COMMAND redeemed; the first was stopped: \(redeemed) \(started)")
        let produced = ofOld.first?.last ?? "?"
        let stored = b.cli(["get", "idp", "me"])
        expectSecret(stored.stdoutText, equals: produced, "the item holds the token the redeeming COMMAND produced")
        let audit = b.cli(["audit", "--json", "--item", "idp/me"]).stdoutText.split(separator: "\n")
        #expect(audit.filter { $0.contains("\"operation\":\"update\"") && $0.contains("\"decision\":\"granted\"") }.count == 1,
                "committed once")
        // The broker kept the lease for the cut-off rotation: the second COMMAND started only
        // after the first's deadline (its timeout + 5 s after release), restart or not.
        let secondStarted = Double(started.last?.split(separator: " ").last ?? "") ?? 0
        // (Without the kept lease the gap is the 0.8 s of the cut; 3 s of slack for a busy host.)
        #expect(secondStarted - firstStarted >= Double(Self.firstTimeout + 5 - 3) * 1000,
                "the second COMMAND waited for the cut-off lease: \(started)")
    }

    @Test func killNineOfTheCLI() throws { try cutOff(.killCLI) }

    @Test func sigtermOfTheCLI() throws { try cutOff(.terminateCLI) }

    @Test func killNineOfTheBrokerRestartedAtOnce() throws { try cutOff(.killBroker) }

    /// A rotation that ends with a cancel (COMMAND failed) frees the lease at once, restart or
    /// not: the recorded lease goes with the cancel.
    @Test func canceledRotationLeavesNoLeaseAcrossARestart() throws {
        let b = try BrokerFixture()
        #expect(b.cli(["put", "idp", "me"], stdin: Array("old".utf8)).status == 0)
        let failed = b.cli(["rotate", "idp", "me", "--timeout", "30", "--", "/bin/sh", "-c", "cat >/dev/null; exit 3"])
        #expect(failed.status != 0 && failed.stderr.contains("exited 3"), "\(failed.stderr)")
        b.stop()
        try b.start()
        let start = Date()
        let next = b.cli(["rotate", "idp", "me", "--timeout", "30", "--", "/bin/sh", "-c", "cat >/dev/null; printf new"])
        #expect(next.status == 0, "\(next.stderr)")
        #expect(Date().timeIntervalSince(start) < 5, "no lease was left behind")
        expectSecret(b.cli(["get", "idp", "me"]).stdoutText, equals: "new")
    }

    /// COMMAND finished but its secret could not be committed (here the item was removed
    /// meanwhile): keyhold says so, and with --print the new secret still reaches stdout.
    @Test func aNewSecretThatWasNotStoredIsReportedAndPrinted() throws {
        let b = try BrokerFixture()
        #expect(b.cli(["put", "idp", "me"], stdin: Array("old".utf8)).status == 0)
        let rm = "'\(TestPaths.keyhold)' --socket '\(b.socketPath)' rm idp me"
        let printed = b.cli(["rotate", "idp", "me", "--print", "--", "/bin/sh", "-c", "cat >/dev/null; \(rm); printf new-1"])
        #expect(printed.status != 0)
        #expect(printed.stderr.contains("COMMAND finished but its new secret may not have been stored"), "\(printed.stderr)")
        expectSecret(printed.stdoutText, equals: "new-1", "with --print the produced secret is not lost")

        #expect(b.cli(["put", "idp", "me"], stdin: Array("old".utf8)).status == 0)
        let quiet = b.cli(["rotate", "idp", "me", "--", "/bin/sh", "-c", "cat >/dev/null; \(rm); printf new-2"])
        #expect(quiet.status != 0 && quiet.stdout.isEmpty)
        #expect(quiet.stderr.contains("that secret is lost") && !quiet.stderr.contains("new-2"), "\(quiet.stderr)")
    }

    /// On a terminal, COMMAND's own process group is the foreground one while it runs: it can
    /// still prompt on /dev/tty (in a background group that read would stop it), and the
    /// terminal comes back to keyhold's group afterwards. Run under script(1)'s pseudo-terminal.
    @Test func commandCanStillPromptOnTheTerminal() throws {
        let b = try BrokerFixture()
        #expect(b.cli(["put", "idp", "me"], stdin: Array("old".utf8)).status == 0)
        let dir = b.directory
        let body = """
            #!/bin/sh
            cat >/dev/null
            IFS= read -r typed </dev/tty
            printf %s "$typed"
            """
        try body.write(toFile: dir + "/prompting.sh", atomically: true, encoding: .utf8)
        chmod(dir + "/prompting.sh", 0o755)
        // After the rotate, the shell inside script(1) reads the terminal itself: had keyhold
        // left its group in the background, that read would stop the shell.
        let inner = "'\(TestPaths.keyhold)' --socket '\(b.socketPath)' rotate idp me --timeout 20 -- \(dir)/prompting.sh; "
            + "echo rotate:$?; IFS= read -r after; echo after:$after"
        let r = runCommand("/usr/bin/script", ["-qec", inner, "/dev/null"], stdin: Array("typed-on-tty\nsecond-line\n".utf8))
        #expect(r.stdoutText.contains("rotate:0"), "\(r.stdoutText) \(r.stderr)")
        #expect(r.stdoutText.contains("after:second-line"), "\(r.stdoutText)")
        expectSecret(b.cli(["get", "idp", "me"]).stdoutText, equals: "typed-on-tty")
    }

    /// COMMAND's own children die with the rotation too: its process group is killed.
    @Test func commandsChildrenDoNotOutliveTheRotation() throws {
        let b = try BrokerFixture()
        #expect(b.cli(["put", "idp", "me"], stdin: Array("old".utf8)).status == 0)
        let dir = b.directory
        let r = b.cli(["rotate", "idp", "me", "--timeout", "30", "--",
                       "/bin/sh", "-c", "cat >/dev/null; (sleep 1; touch \(dir)/survivor) >/dev/null & printf new"])
        #expect(r.status == 0, "\(r.stderr)")
        usleep(2_000_000)
        #expect(!FileManager.default.fileExists(atPath: dir + "/survivor"), "a child of COMMAND outlived the rotation")
    }
}
