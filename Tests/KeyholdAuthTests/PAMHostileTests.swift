import Foundation
import KeyholdCore
import Testing
@testable import KeyholdAuth
import KeyholdTestSupport

private let matrix = PAMTestStacks.matrixModule

/// A private service directory with one `custom` stack, removed at the end of the test.
private func withStack<R>(_ lines: [String], extra: (String) -> Void = { _ in }, _ body: (String) throws -> R) rethrows -> R {
    let dir = PAMFixture.tempDirectory()
    defer { try? FileManager.default.removeItem(atPath: dir) }
    PAMFixture.write(lines.joined(separator: "\n") + "\n", to: dir + "/custom")
    PAMFixture.write("auth required pam_deny.so\naccount required pam_deny.so\n", to: dir + "/other")
    extra(dir)
    return try body(dir)
}

/// Interaction rules, interrupts, hanging modules, the NULL-resp path, PAM items, and helpers
/// that crash or garble the framing.
@Suite(.serialized) struct PAMHostileTests {
    @Test func noInteractionStopsAtThePromptAndTheModuleNeverGetsAnAnswer() throws {
        // If pam_matrix had received any answer, the next (required) module would run and leave
        // the marker file.
        try withStack(["auth required \(matrix)", "auth required pam_exec.so /usr/bin/touch MARKER",
                       "account required pam_permit.so"]) { dir in
            let stack = try String(contentsOfFile: dir + "/custom", encoding: .utf8)
            PAMFixture.write(stack.replacingOccurrences(of: "MARKER", with: dir + "/answered"), to: dir + "/custom")
            let conv = RecordingConversation.password("d4ve")
            let r = PAMFixture.authenticator(dir).authenticate(
                PAMRequest(service: "custom", user: "dave"), allowInteraction: false, interruptFD: nil) { conv($0) }
            #expect(r == .interactionNeeded)
            #expect(conv.messages.isEmpty)
            #expect(!FileManager.default.fileExists(atPath: dir + "/answered"))
        }
    }

    @Test func noInteractionStillRelaysInfoAndSucceedsWithoutPrompt() {
        withStack(["auth optional pam_echo.so Touch the reader", "auth required pam_permit.so",
                       "account required pam_permit.so"]) { dir in
            let conv = RecordingConversation { _ in .answer(SecureBytes(count: 0)) }
            let r = PAMFixture.authenticator(dir).authenticate(
                PAMRequest(service: "custom", user: "dave"), allowInteraction: false, interruptFD: nil) { conv($0) }
            #expect(r == .success(answeredPrompt: false))
            #expect(conv.messages == [.info("Touch the reader")])
        }
    }

    @Test func verboseMatrixUsesTheNullResponsePath() {
        // pam_matrix `verbose` prompts echo-on, then reports the outcome with resp == NULL.
        withStack(["auth required \(matrix) verbose", "account required pam_permit.so"]) { dir in
            let ok = RecordingConversation.password("d4ve")
            let r1 = PAMFixture.authenticator(dir).authenticate(
                PAMRequest(service: "custom", user: "dave"), allowInteraction: true, interruptFD: nil) { ok($0) }
            #expect(r1 == .success(answeredPrompt: true))
            #expect(ok.messages == [.promptEchoOff("Password: "), .info("Authentication succeeded")])

            let bad = RecordingConversation.password("nope")
            let r2 = PAMFixture.authenticator(dir).authenticate(
                PAMRequest(service: "custom", user: "dave"), allowInteraction: true, interruptFD: nil) { bad($0) }
            #expect(r2 == .failed(code: 7))
            #expect(bad.messages == [.promptEchoOff("Password: "), .error("Authentication failed")])
        }
    }

    @Test func itemsReachTheModules() {
        withStack(["auth required pam_exec.so SCRIPT", "account required pam_permit.so"]) { dir in
            PAMFixture.write("#!/bin/sh\nprintf '%s|%s|%s|%s' \"$PAM_USER\" \"$PAM_RUSER\" \"$PAM_TTY\" \"$PAM_RHOST\" > \(dir)/items\n",
                             to: dir + "/items.sh", mode: 0o755)
            PAMFixture.write("auth required pam_exec.so \(dir)/items.sh\naccount required pam_permit.so\n", to: dir + "/custom")
            let r = PAMFixture.authenticator(dir).authenticate(
                PAMRequest(service: "custom", user: "dave", ruser: "dave", tty: "/dev/pts/7", rhost: "203.0.113.9"),
                allowInteraction: false, interruptFD: nil) { _ in .cancel }
            #expect(r == .success(answeredPrompt: false))
            #expect((try? String(contentsOfFile: dir + "/items", encoding: .utf8)) == "dave|dave|/dev/pts/7|203.0.113.9")
        }
    }

    @Test func helperIsHardenedAndModuleProgramsDoNotInheritTheChannel() throws {
        let dir = PAMFixture.tempDirectory()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        // pam_exec's program is a child of the helper: it reports on its parent and on itself.
        PAMFixture.write("""
            #!/bin/sh
            grep -E '^(SigBlk|SigIgn):' /proc/$PPID/status > \(dir)/status
            grep 'core file size' /proc/$PPID/limits > \(dir)/limits
            ls /proc/$PPID/fd | sort -n | tr '\\n' ' ' > \(dir)/helper-fds
            for f in /proc/$$/fd/*; do readlink "$f"; done > \(dir)/own-fds
            exit 0
            """, to: dir + "/probe.sh", mode: 0o755)
        PAMFixture.write("auth required pam_exec.so \(dir)/probe.sh\naccount required pam_permit.so\n", to: dir + "/custom")
        let r = PAMFixture.authenticator(dir).authenticate(PAMRequest(service: "custom", user: "dave"),
                                                           allowInteraction: false, interruptFD: nil) { _ in .cancel }
        #expect(r == .success(answeredPrompt: false))
        let status = try String(contentsOfFile: dir + "/status", encoding: .utf8)
        let blocked = status.split(separator: "\n").first { $0.hasPrefix("SigBlk:") }.flatMap { UInt64($0.split(separator: "\t").last ?? "", radix: 16) }
        let ignored = status.split(separator: "\n").first { $0.hasPrefix("SigIgn:") }.flatMap { UInt64($0.split(separator: "\t").last ?? "", radix: 16) }
        #expect(blocked.map { $0 & (1 << (SIGINT - 1)) != 0 } == true)   // SIGINT blocked (pam_fprintd's cancel)
        #expect(ignored.map { $0 & (1 << (SIGPIPE - 1)) != 0 } == true)  // a dead broker is an error, not a signal
        let limits = try String(contentsOfFile: dir + "/limits", encoding: .utf8)
        #expect(limits.split(whereSeparator: \.isWhitespace).suffix(3) == ["0", "0", "bytes"])  // RLIMIT_CORE 0/0
        // The helper holds 0, 1, 2, the channel and whatever pam_exec opened for its child;
        // the module's program must not hold the channel.
        let helperFDs = try String(contentsOfFile: dir + "/helper-fds", encoding: .utf8).split(separator: " ")
        #expect(helperFDs.prefix(4) == ["0", "1", "2", "3"])
        // (Listed by target, not number: the probe shell's own pipelines come and go on low fds.)
        let ownFDs = try String(contentsOfFile: dir + "/own-fds", encoding: .utf8).split(separator: "\n")
        #expect(!ownFDs.contains { $0.hasPrefix("socket:") }, "\(ownFDs)")
    }

    /// A module that never returns (pam_exec waiting on a long sleep), preceded by an info
    /// message so the test knows the helper is inside the stack.
    private func hangingStack(_ marker: String) -> [String] {
        ["auth optional pam_echo.so waiting", "auth required pam_exec.so /bin/sleep \(marker)", "account required pam_permit.so"]
    }

    @Test func interruptWhileAModuleHangsCancelsAndKillsItsChildren() {
        let marker = "987.\(getpid())"
        withStack(hangingStack(marker)) { dir in
            var p: [Int32] = [-1, -1]
            #expect(pipe(&p) == 0)
            defer { close(p[0]); close(p[1]) }
            let writeEnd = p[1]
            let conv = RecordingConversation { m in
                // Fire the interrupt from another thread once the helper is inside the stack.
                if case .info = m { Thread.detachNewThread { usleep(100_000); _ = write(writeEnd, "x", 1) } }
                return .answer(SecureBytes(count: 0))
            }
            let r = PAMFixture.authenticator(dir).authenticate(
                PAMRequest(service: "custom", user: "dave"), allowInteraction: true, interruptFD: p[0]) { conv($0) }
            #expect(r == .canceled)
            #expect(conv.messages == [.info("waiting")])
            #expect(PAMFixture.allGone("sleep \(marker)"))
        }
    }

    @Test func interruptFiredDuringThePromptCancels() {
        var p: [Int32] = [-1, -1]
        #expect(pipe(&p) == 0)
        defer { close(p[0]) }
        let writeEnd = p[1]
        // The caller hangs up while being asked: the interrupt fd reports POLLHUP.
        let r = PAMFixture.authenticator().authenticate(
            PAMRequest(service: "keyhold-passcode", user: "alice"), allowInteraction: true, interruptFD: p[0]) { _ in
            close(writeEnd)
            return .answer(PAMFixture.secret("s3cret"))
        }
        #expect(r == .canceled)
    }

    @Test func hangingModuleIsKilledAtTheDeadline() {
        let marker = "988.\(getpid())"
        withStack(hangingStack(marker)) { dir in
            let r = PAMFixture.authenticator(dir, deadline: 1).authenticate(
                PAMRequest(service: "custom", user: "dave"), allowInteraction: true, interruptFD: nil) { _ in .answer(SecureBytes(count: 0)) }
            #expect(r == .helperFailed)
            #expect(PAMFixture.allGone("sleep \(marker)"))
        }
    }

    // MARK: helpers that are not keyholdd: crash, exit early, garble, lie inconsistently

    private func fakeHelper(_ script: String) -> (PAMAuthenticator, String) {
        let dir = PAMFixture.tempDirectory()
        PAMFixture.write("#!/bin/sh\n" + script + "\n", to: dir + "/helper", mode: 0o755)
        return (PAMAuthenticator(helperExecutable: dir + "/helper", serviceDirectory: PAMFixture.testStacks, deadlineSeconds: 2), dir)
    }

    @Test(arguments: [
        "exit 0",                                                  // no result at all
        "kill -SEGV $$",                                           // crash
        "printf 'garbage garbage garbage' >&3",                    // unknown frame kind
        "printf '\\020\\177\\377\\377\\377' >&3; sleep 30",         // message header claiming 2 GiB
        "printf '\\021\\000\\000\\000\\005\\003\\000\\000\\000\\007' >&3", // 'success' stage with code 7
        "printf '\\021\\000\\000\\000\\004\\003\\000\\000\\000' >&3",      // done frame too short
        "printf '\\020\\000\\000\\000\\002\\011x' >&3; sleep 30",   // unknown message style
        "printf '\\002\\000\\000\\000\\000' >&3; sleep 30",         // a broker-only frame kind
        "printf '\\020\\000\\000\\000\\002\\004x' >&3; sleep 30",   // info, then silence past the deadline
    ])
    func misbehavingHelperFailsClosed(script: String) {
        let (auth, dir) = fakeHelper(script)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let r = auth.authenticate(PAMRequest(service: "keyhold-passcode", user: "alice"),
                                  allowInteraction: true, interruptFD: nil) { _ in .answer(SecureBytes(count: 0)) }
        #expect(r == .helperFailed)
    }

    @Test func moduleTextCannotCarryTerminalEscapes() {
        // info "\e[2J\x9b\x07ok\tgo\n", then a well-formed "success" done frame.
        // It reads a byte of the request first: a helper that exits before the broker has sent
        // the request is (correctly) a failed helper, which would race with what is tested here.
        let (auth, dir) = fakeHelper("head -c 1 <&3 >/dev/null; printf '\\020\\000\\000\\000\\017\\004\\033[2J\\302\\233\\007ok\\tgo\\n\\377' >&3; printf '\\021\\000\\000\\000\\005\\003\\000\\000\\000\\000' >&3")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        var seen: [PAMMessage] = []
        let r = auth.authenticate(PAMRequest(service: "keyhold-passcode", user: "alice"),
                                  allowInteraction: false, interruptFD: nil) { m in seen.append(m); return .answer(SecureBytes(count: 0)) }
        #expect(r == .success(answeredPrompt: false))
        #expect(seen == [.info("[2Jok\tgo\n\u{FFFD}")])
    }

    @Test func floodOfMessagesFailsClosed() {
        let (auth, dir) = fakeHelper("while :; do printf '\\020\\000\\000\\000\\002\\004x'; done >&3")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        var seen = 0
        let r = auth.authenticate(PAMRequest(service: "keyhold-passcode", user: "alice"),
                                  allowInteraction: true, interruptFD: nil) { _ in seen += 1; return .answer(SecureBytes(count: 0)) }
        #expect(r == .helperFailed)
        #expect(seen == PAMAuthenticator.maxMessages)
    }

    @Test func missingHelperExecutableFails() {
        let auth = PAMAuthenticator(helperExecutable: "/nonexistent/keyhold-pam-helper", serviceDirectory: nil)
        #expect(auth.authenticate(PAMRequest(service: "keyhold", user: "alice"), allowInteraction: true,
                                  interruptFD: nil) { _ in .cancel } == .helperFailed)
    }

    @Test func helperRejectsAGarbledRequest() throws {
        // The real helper, fed a broken request on fd 3, exits without running PAM.
        var pair: [Int32] = [-1, -1]
        #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &pair) == 0)
        defer { close(pair[0]) }
        let bad: [UInt8] = [0x01, 0, 0, 0, 3, 9, 9, 9]
        _ = bad.withUnsafeBytes { write(pair[0], $0.baseAddress, $0.count) }
        let p = Process()
        p.executableURL = URL(fileURLWithPath: PAMFixture.helper)
        p.arguments = ["--pam-helper"]
        // Foundation's Process closes fds above 2; hand over fd 3 through a shell redirection.
        p.executableURL = URL(fileURLWithPath: "/bin/sh")
        p.arguments = ["-c", "exec \"$0\" --pam-helper 3<&0", PAMFixture.helper]
        p.standardInput = FileHandle(fileDescriptor: pair[1], closeOnDealloc: true)
        try p.run()
        p.waitUntilExit()
        #expect(p.terminationStatus == 72)
    }
}
