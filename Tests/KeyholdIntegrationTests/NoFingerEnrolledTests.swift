import Foundation
import Glibc
import Testing
import KeyholdClient
import KeyholdCore
import KeyholdTestSupport

/// Issue 38, item 3: on a machine where the account has no enrolled finger (fprintd's virtual
/// reader with no print), `biometry-current-set or device-passcode` stores the item, bound to
/// the empty enrolment set, and the password releases it, as the `or` promises; a finger
/// enrolled later does not open it (the set changed) while the password still does. A policy
/// that needs a finger still fails clearly.
@Suite(.serialized) struct NoFingerEnrolledTests {
    let password = "right-password"

    func broker(_ fp: FprintEnvironment) throws -> BrokerFixture {
        try BrokerFixture(passwords: ["root": password], environment: ["DBUS_SYSTEM_BUS_ADDRESS": fp.busAddress],
                          fprintStateDirectory: fp.stateDirectory)
    }

    @Test func orDevicePasscodeIsStoredAndReleasedWithThePassword() throws {
        try withFprintEnvironment { fp in
            #expect(try fp.enrolledFingers(user: "root").isEmpty)
            let b = try broker(fp)
            let askpass = ["KEYHOLD_ASKPASS": b.askpass(answering: password)]
            let put = b.cli(["put", "github.com", "alice", "--kind", "refresh-token",
                             "--policy", "biometry-current-set or device-passcode"], stdin: Array("tok-1".utf8))
            #expect(put.status == 0, "\(put.stderr)")
            #expect(b.cli(["state", "github.com", "alice"]).stdoutText == "requires-authentication\n")
            let get = b.cli(["get", "github.com", "alice", "--reason", "git push"], environment: askpass)
            #expect(get.status == 0, "\(get.stderr)")
            expectSecret(get.stdoutText, equals: "tok-1")
            let wrong = b.cli(["get", "github.com", "alice"], environment: ["KEYHOLD_ASKPASS": b.askpass(answering: "wrong", name: "wrong")])
            #expect(wrong.status == 6 && wrong.stdout.isEmpty, "\(wrong.stderr)")
            // user-presence as the alternative: the password too.
            #expect(b.cli(["put", "p", "x", "--policy", "user-presence or biometry-current-set"], stdin: [7]).status == 0)
            #expect(b.cli(["get", "p", "x"], environment: askpass).stdout == [7])

            // The Swift API, as the README shows it.
            let vault = Vault(socketPath: b.socketPath)
            try vault.add(SecureBytes(copying: Array("swift-tok".utf8)), service: "api", account: "alice", kind: .refreshToken,
                          access: AccessControl(policy: try Policy(parsing: "biometry-current-set or device-passcode")))

            // A finger enrolled afterwards is a change of the set the item is bound to: the
            // finger does not open it; the password still does.
            try fp.enroll(user: "root", print: "print-root")
            let touch = try fp.scan(print: "print-root", timeout: 5)
            let fingerOnly = b.cli(["get", "github.com", "alice"], environment: ["KEYHOLD_ASKPASS": b.askpass(answering: nil, name: "cancel")])
            touch.cancel()
            #expect(fingerOnly.status == 5 && fingerOnly.stdout.isEmpty, "only the password is asked: \(fingerOnly.stderr)")
            let after = b.cli(["get", "github.com", "alice"], environment: askpass)
            #expect(after.status == 0, "\(after.stderr)")
            expectSecret(after.stdoutText, equals: "tok-1")
            let audit = b.cli(["audit", "--json", "--item", "github.com/alice"]).stdoutText.split(separator: "\n")
            #expect(audit.filter { $0.contains("\"operation\":\"get\"") && $0.contains("\"outcome\":\"ok\"") }
                .allSatisfy { $0.contains("\"method\":\"password\"") }, "\(audit)")
        }
    }

    /// A machine where fprintd was never installed: no print store at all.
    @Test func noPrintStoreAtAllIsNoFingerEnrolled() throws {
        let probe = try BrokerFixture()
        probe.stop()
        let b = try BrokerFixture(passwords: ["root": password], fprintStateDirectory: probe.directory + "/no-fprintd-here")
        let put = b.cli(["put", "github.com", "alice", "--policy", "biometry-current-set or device-passcode"], stdin: Array("t".utf8))
        #expect(put.status == 0, "\(put.stderr)")
        let get = b.cli(["get", "github.com", "alice"], environment: ["KEYHOLD_ASKPASS": b.askpass(answering: password)])
        #expect(get.status == 0 && get.stdout == Array("t".utf8), "\(get.stderr)")
        let alone = b.cli(["put", "fp", "x", "--policy", "biometry-current-set"], stdin: Array("t".utf8))
        #expect(alone.status == 6 && alone.stderr.contains("no finger is enrolled"), "\(alone.stderr)")
    }

    @Test func aPolicyThatNeedsAFingerStillFailsClearly() throws {
        try withFprintEnvironment { fp in
            let b = try broker(fp)
            for policy in ["biometry-current-set", "biometry-any", "biometry-current-set and device-passcode",
                           "biometry-current-set or biometry-any"] {
                let put = b.cli(["put", "fp", policy, "--policy", policy], stdin: Array("v".utf8))
                if policy == "biometry-any" {
                    // Stored (it binds no set), but a get cannot be satisfied without a finger.
                    #expect(put.status == 0, "\(put.stderr)")
                    let get = b.cli(["get", "fp", policy], environment: ["KEYHOLD_ASKPASS": b.askpass(answering: password)])
                    #expect(get.status == 6 && get.stdout.isEmpty, "\(policy): \(get.stderr)")
                } else {
                    #expect(put.status == 6 && put.stderr.contains("no finger is enrolled"), "\(policy): \(put.status) \(put.stderr)")
                    #expect(b.cli(["state", "fp", policy]).stdoutText == "not-found\n", "\(policy): nothing stored")
                }
            }
        }
    }
}
