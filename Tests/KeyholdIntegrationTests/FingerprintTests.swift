import Foundation
import Glibc
import Testing
import KeyholdClient
import KeyholdCore
import KeyholdProtocol
import Synchronization
import KeyholdTestSupport

/// Issue 4: fingerprints through the real broker, pam_fprintd, fprintd and libfprint's
/// virtual reader on a private bus. Each test gets its own fprintd (the virtual reader models
/// heat, and enrolment state must start empty).
@Suite(.serialized) struct FingerprintTests {
    let password = "right-password"

    /// A broker wired to a private fprintd: the same bus address and print store.
    func broker(_ fp: FprintEnvironment) throws -> BrokerFixture {
        try BrokerFixture(passwords: ["root": password], environment: ["DBUS_SYSTEM_BUS_ADDRESS": fp.busAddress],
                          fprintStateDirectory: fp.stateDirectory)
    }

    func auditJSON(_ b: BrokerFixture, _ item: String) -> [[String: Any]] {
        b.cli(["audit", "--json", "--item", item]).stdoutText.split(separator: "\n")
            .compactMap { try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] }
    }

    /// Runs `keyhold get` while the reader is touched with `print` once fprintd asks for a finger.
    func getWithScan(_ b: BrokerFixture, _ fp: FprintEnvironment, _ item: [String], print: String?) throws -> CommandResult {
        let touch = try print.map { try fp.scan(print: $0) }
        defer { touch?.cancel() }
        return b.cli(["get"] + item, environment: ["KEYHOLD_ASKPASS": b.askpass(answering: password)])
    }

    @Test func enrolledFingerReleasesAndOtherFingerFails() throws {
        try withFprintEnvironment { fp in
            try fp.enroll(user: "root", print: "print-root")
            let b = try broker(fp)
            #expect(b.cli(["put", "any", "x", "--policy", "biometry-any"], stdin: Array("fp-any".utf8)).status == 0)
            #expect(b.cli(["put", "cur", "x", "--policy", "biometry-current-set"], stdin: Array("fp-cur".utf8)).status == 0)
            #expect(b.cli(["state", "cur", "x"]).stdoutText == "requires-authentication\n")

            let any = try getWithScan(b, fp, ["any", "x"], print: "print-root")
            #expect(any.status == 0, "\(any.stderr)")
            expectSecret(any.stdoutText, equals: "fp-any")
            let cur = try getWithScan(b, fp, ["cur", "x"], print: "print-root")
            #expect(cur.status == 0, "\(cur.stderr)")
            expectSecret(cur.stdoutText, equals: "fp-cur")
            // pam_fprintd's own words reach the caller through the relay.
            #expect(cur.stderr.contains("finger"))
            #expect(auditJSON(b, "any/x").contains { $0["operation"] as? String == "get" && $0["method"] as? String == "fingerprint" })
            #expect(auditJSON(b, "cur/x").contains { $0["operation"] as? String == "get" && $0["method"] as? String == "fingerprint" })

            let wrong = try getWithScan(b, fp, ["any", "x"], print: "print-somebody-else")
            #expect(wrong.status == 6 && wrong.stdout.isEmpty, "\(wrong.stderr)")

            // `keyhold biometry` shows the reader (asked by the CLI itself on the bus: the broker
            // keeps no D-Bus client) and the enrolled finger (from the broker).
            let info = b.cli(["biometry"], environment: ["DBUS_SYSTEM_BUS_ADDRESS": fp.busAddress])
            #expect(info.stdoutText.contains("Virtual device for debugging"), "\(info.stdoutText)")
            #expect(info.stdoutText.contains("right-index-finger"))
            #expect(info.stdoutText.contains("current set (invalidated by any change): 1"))
        }
    }

    @Test func noScanTimesOutWithoutHoldingUpOthers() throws {
        try withFprintEnvironment { fp in
            try fp.enroll(user: "root", print: "print-root")
            let b = try broker(fp)
            #expect(b.cli(["put", "any", "x", "--policy", "biometry-any"], stdin: Array("v".utf8)).status == 0)
            #expect(b.cli(["put", "open", "x"], stdin: Array("open-value".utf8)).status == 0)
            let result = ResultBox()
            let timed = Thread { result.set(b.cli(["get", "any", "x"], environment: ["KEYHOLD_ASKPASS": b.askpass(answering: password)])) }
            timed.start()
            #expect(fp.waitUntilFingerNeeded(timeout: 10))
            // While that caller waits for a finger, others are served.
            for _ in 0..<5 { expectSecret(b.cli(["get", "open", "x"]).stdoutText, equals: "open-value") }
            while !timed.isFinished { usleep(50_000) }
            let r = try #require(result.value)
            #expect(r.status == 6 && r.stdout.isEmpty, "\(r.stderr)")
        }
    }

    @Test func readerErrorFailsAtOnce() throws {
        try withFprintEnvironment { fp in
            try fp.enroll(user: "root", print: "print-root")
            let b = try broker(fp)
            #expect(b.cli(["put", "any", "x", "--policy", "biometry-any"], stdin: Array("v".utf8)).status == 0)
            let touch = try fp.reportError()
            defer { touch.cancel() }
            let r = b.cli(["get", "any", "x"], environment: ["KEYHOLD_ASKPASS": b.askpass(answering: password)])
            #expect(r.status == 6 && r.stdout.isEmpty)
        }
    }

    @Test func newFingerInvalidatesOnlyTheCurrentSetItem() throws {
        try withFprintEnvironment { fp in
            try fp.enroll(user: "root", print: "print-root")
            let b = try broker(fp)
            #expect(b.cli(["put", "any", "x", "--policy", "biometry-any"], stdin: Array("fp-any".utf8)).status == 0)
            #expect(b.cli(["put", "cur", "x", "--policy", "biometry-current-set"], stdin: Array("fp-cur".utf8)).status == 0)
            #expect(b.cli(["put", "alt", "x", "--policy", "biometry-current-set or device-passcode"], stdin: Array("fp-alt".utf8)).status == 0)

            try fp.enroll(user: "root", finger: "left-thumb", print: "print-thumb")
            #expect(b.cli(["state", "cur", "x"]).stdoutText == "invalidated\n")
            #expect(b.cli(["state", "any", "x"]).stdoutText == "requires-authentication\n")
            let ask = b.askpass(answering: password)
            let inval = b.cli(["get", "cur", "x"], environment: ["KEYHOLD_ASKPASS": ask])
            #expect(inval.status == 8 && inval.stdout.isEmpty)
            #expect(!fp.waitUntilFingerNeeded(timeout: 0.5), "no prompt for an invalidated item")
            #expect(auditJSON(b, "cur/x").contains { $0["outcome"] as? String == "invalidated" })
            // biometry-any keeps working across enrolment changes (the plain virtual reader
            // verifies the first enrolled finger by number: now the left thumb).
            let any = try getWithScan(b, fp, ["any", "x"], print: "print-thumb")
            expectSecret(any.stdoutText, equals: "fp-any", "\(any.stderr)")
            // An `or` with the passcode is not invalidated: the passcode alone still opens it.
            #expect(b.cli(["state", "alt", "x"]).stdoutText == "requires-authentication\n")
            expectSecret(b.cli(["get", "alt", "x"], environment: ["KEYHOLD_ASKPASS": ask]).stdoutText, equals: "fp-alt")
            // The only way on is to store the item again.
            #expect(b.cli(["put", "cur", "x", "--update", "--policy", "biometry-current-set"], stdin: Array("fp-new".utf8),
                          environment: ["KEYHOLD_ASKPASS": ask]).status == 8)
            // An invalidated item's policy cannot be met any more: its owner's password removes it.
            #expect(b.cli(["rm", "cur", "x"]).status == 7)
            #expect(b.cli(["rm", "cur", "x"], environment: ["KEYHOLD_ASKPASS": ask]).status == 0)
            #expect(b.cli(["put", "cur", "x", "--policy", "biometry-current-set"], stdin: Array("fp-new".utf8)).status == 0)
            #expect(b.cli(["state", "cur", "x"]).stdoutText == "requires-authentication\n")
            // Removing the finger again is a change too.
            try fp.deleteFinger(user: "root", finger: "left-thumb")
            #expect(b.cli(["state", "cur", "x"]).stdoutText == "invalidated\n")
        }
    }

    @Test func noPrintsFallsBackToPasswordOrFailsClearly() throws {
        try withFprintEnvironment { fp in
            try fp.enroll(user: "root", print: "print-root")
            let b = try broker(fp)
            #expect(b.cli(["put", "up", "x", "--policy", "user-presence"], stdin: Array("fp-up".utf8)).status == 0)
            #expect(b.cli(["put", "any", "x", "--policy", "biometry-any"], stdin: Array("fp-any".utf8)).status == 0)
            // With a finger enrolled, user-presence takes the fingerprint (no password asked).
            let byFinger = try getWithScan(b, fp, ["up", "x"], print: "print-root")
            expectSecret(byFinger.stdoutText, equals: "fp-up", "\(byFinger.stderr)")
            #expect(auditJSON(b, "up/x").last { $0["operation"] as? String == "get" }?["method"] as? String == "fingerprint", "\(byFinger.stderr) \(b.brokerLog)")

            try fp.deleteAll(user: "root")
            let ask = b.askpass(answering: password)
            let up = b.cli(["get", "up", "x"], environment: ["KEYHOLD_ASKPASS": ask])
            #expect(up.status == 0, "\(up.stderr)")
            expectSecret(up.stdoutText, equals: "fp-up")
            #expect(auditJSON(b, "up/x").last { $0["operation"] as? String == "get" }?["method"] as? String == "password")
            let any = b.cli(["get", "any", "x"], environment: ["KEYHOLD_ASKPASS": ask])
            #expect(any.status == 6 && any.stderr.contains("no finger is enrolled"))
            #expect(b.cli(["biometry"]).stdoutText.contains("enrolled fingers: none"))
        }
    }

    @Test func cancelDuringTheFingerprintWaitEndsItAtOnce() throws {
        try withFprintEnvironment { fp in
            try fp.enroll(user: "root", print: "print-root")
            let b = try broker(fp)
            #expect(b.cli(["put", "any", "x", "--policy", "biometry-any"], stdin: Array("fp-any".utf8)).status == 0)
            let p = Process()
            p.executableURL = URL(fileURLWithPath: TestPaths.keyhold)
            p.arguments = ["--socket", b.socketPath, "get", "any", "x"]
            p.environment = ProcessInfo.processInfo.environment.merging(["KEYHOLD_ASKPASS": b.askpass(answering: password)]) { _, n in n }
            let out = Pipe()
            p.standardOutput = out
            p.standardError = FileHandle.nullDevice
            try p.run()
            #expect(fp.waitUntilFingerNeeded(timeout: 10))
            kill(p.processIdentifier, SIGINT)           // Ctrl-C
            p.waitUntilExit()
            #expect(p.terminationStatus == 5)
            #expect(out.fileHandleForReading.readDataToEndOfFile().isEmpty)
            // The broker ended that PAM transaction: fprintd stops waiting and the reader is free.
            var released = false
            for _ in 0..<100 where !released {
                released = !fp.waitUntilFingerNeeded(timeout: 0.05)
                usleep(50_000)
            }
            #expect(released)
            let again = try getWithScan(b, fp, ["any", "x"], print: "print-root")
            expectSecret(again.stdoutText, equals: "fp-any", "\(again.stderr)")
            #expect(auditJSON(b, "any/x").contains { $0["outcome"] as? String == "user-canceled" })
        }
    }
}

/// A program using the client library (as the Secret Service agent does for a dismissed
/// prompt) abandons a request while the broker waits for a finger, which it does without a
/// prompt, so there is nothing to answer with a cancel: the library tells the broker, which
/// ends the wait at once, *user canceled*. (pam_fprintd's own timeout, 10 s, would end it as a
/// failed scan instead.)
extension FingerprintTests {
    final class Abandoning: Interaction, @unchecked Sendable {
        let abandoned = Atomic<Bool>(false)
        func answer(_ prompt: KeyholdProtocol.Prompt) -> SecureBytes? { nil }
        func show(_ notice: Notice) {}
        var cancellation: (@Sendable () -> Bool)? { { [self] in abandoned.load(ordering: .relaxed) } }
    }

    final class Outcome: @unchecked Sendable {
        let lock = NSLock()
        var value: Result<Int, KeyholdError>?
    }

    @Test func aLibraryCallerAbandoningTheFingerprintWaitEndsIt() throws {
        try withFprintEnvironment { fp in
            try fp.enroll(user: "root", print: "print-root")
            let b = try broker(fp)
            #expect(b.cli(["put", "any", "x", "--policy", "biometry-any"], stdin: Array("fp-any".utf8)).status == 0)
            let vault = Vault(socketPath: b.socketPath)
            let interaction = Abandoning()
            let outcome = Outcome()
            let caller = Thread {
                let r: Result<Int, KeyholdError>
                do throws(KeyholdError) {
                    let s = try vault.secret(service: "any", account: "x", interaction: interaction)
                    r = .success(s.count)
                    s.wipe()
                } catch {
                    r = .failure(error)
                }
                outcome.lock.withLock { outcome.value = r }
            }
            caller.start()
            #expect(fp.waitUntilFingerNeeded(timeout: 10))
            interaction.abandoned.store(true, ordering: .relaxed)
            var ended: Result<Int, KeyholdError>?
            for _ in 0..<1500 where ended == nil {
                ended = outcome.lock.withLock { outcome.value }
                if ended == nil { usleep(20_000) }
            }
            switch ended {
            case .failure(.userCanceled)?: break
            default: Issue.record("expected user canceled, got \(String(describing: ended.map { r in r.map { _ in "a secret" } }))")
            }
            // The broker ended that PAM transaction: fprintd stops waiting and the reader is free.
            var released = false
            for _ in 0..<100 where !released {
                released = !fp.waitUntilFingerNeeded(timeout: 0.05)
                usleep(50_000)
            }
            #expect(released)
            let audit = auditJSON(b, "any/x")
            #expect(audit.contains { $0["outcome"] as? String == "user-canceled" })
            #expect(!audit.contains { $0["operation"] as? String == "get" && $0["decision"] as? String == "granted" })
            // The same vault asks again on a new connection, and a scan releases the secret.
            let touch = try fp.scan(print: "print-root")
            defer { touch.cancel() }
            let again = Abandoning()
            let secret = try vault.secret(service: "any", account: "x", interaction: again)
            defer { secret.wipe() }
            expectSecret(secret.withUnsafeBytes { Array($0) }, equals: Array("fp-any".utf8))
        }
    }
}

final class ResultBox: @unchecked Sendable {
    private let lock = NSLock()
    private var r: CommandResult?
    func set(_ v: CommandResult) { lock.lock(); r = v; lock.unlock() }
    var value: CommandResult? { lock.lock(); defer { lock.unlock() }; return r }
}
