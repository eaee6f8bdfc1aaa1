import Foundation
import Glibc
import Testing
import KeyholdCore
import KeyholdTestSupport

/// Issue 10, item 5: `rotate` passes the same gate as `get` — `--allow-exe` against the
/// `keyhold` process, a `biometry-current-set` item invalidated by an enrolment change — and a
/// second rotate that cannot get the lease within its own timeout answers *conflict*.
@Suite(.serialized) struct RotationGateTests {
    func generation(_ b: BrokerFixture, _ s: String, _ environment: [String: String] = [:]) -> Int {
        let j = (try? JSONSerialization.jsonObject(with: Data(b.cli(["state", s, "x", "--json"], environment: environment).stdout))) as? [String: Any]
        return j?["generation"] as? Int ?? -1
    }

    @Test func allowExeIsHonouredOnRotate() throws {
        let b = try BrokerFixture()
        let marker = b.directory + "/ran"
        let command = ["--", "/bin/sh", "-c", "touch \(marker); printf new"]
        #expect(b.cli(["put", "other", "x", "--allow-exe", "/bin/true"], stdin: Array("old".utf8)).status == 0)
        let refused = b.cli(["rotate", "other", "x"] + command)
        #expect(refused.status == 10, "\(refused.stderr)")
        #expect(!FileManager.default.fileExists(atPath: marker), "COMMAND never saw the secret")
        #expect(generation(b, "other") == 1)

        #expect(b.cli(["put", "mine", "x", "--allow-exe", TestPaths.keyhold], stdin: Array("old".utf8)).status == 0)
        let ok = b.cli(["rotate", "mine", "x", "--print"] + command)
        #expect(ok.status == 0, "\(ok.stderr)")
        expectSecret(ok.stdoutText, equals: "new")
        #expect(generation(b, "mine") == 2)
    }

    @Test func secondRotateTimingOutWhileWaitingIsConflict() throws {
        let b = try BrokerFixture()
        #expect(b.cli(["put", "idp", "x"], stdin: Array("old".utf8)).status == 0)
        let d = b.directory
        let r = b.script("""
            KH rotate idp x -- /bin/sh -c 'touch \(d)/a-started; sleep 5; printf from-a' &
            a=$!
            i=0; while [ ! -e \(d)/a-started ] && [ $i -lt 300 ]; do sleep 0.05; i=$((i+1)); done
            KH rotate idp x --timeout 1 -- /bin/sh -c 'touch \(d)/b-ran; printf from-b'; echo "b:$?"
            wait $a; echo "a:$?"
            """)
        #expect(r.stdoutText.contains("b:14"), "\(r.stdoutText) \(r.stderr)")
        #expect(r.stdoutText.contains("a:0"), "\(r.stdoutText) \(r.stderr)")
        #expect(!FileManager.default.fileExists(atPath: d + "/b-ran"), "the second rotate's command never ran")
        expectSecret(b.cli(["get", "idp", "x"]).stdoutText, equals: "from-a")
        #expect(generation(b, "idp") == 2)
    }

    @Test func biometryCurrentSetRotateAfterEnrolmentChangeIsInvalidated() throws {
        try withFprintEnvironment { fp in
            try fp.enroll(user: "root", print: "print-root")
            let b = try BrokerFixture(passwords: ["root": "pw"], environment: ["DBUS_SYSTEM_BUS_ADDRESS": fp.busAddress],
                                      fprintStateDirectory: fp.stateDirectory)
            let ask = ["KEYHOLD_ASKPASS": b.askpass(answering: "pw")]
            #expect(b.cli(["put", "cur", "x", "--policy", "biometry-current-set"], stdin: Array("fp-cur".utf8)).status == 0)
            let marker = b.directory + "/ran"
            let command = ["--", "/bin/sh", "-c", "touch \(marker); cat >/dev/null; printf new"]
            do {
                let touch = try fp.scan(print: "print-root")
                defer { touch.cancel() }
                let ok = b.cli(["rotate", "cur", "x"] + command, environment: ask)
                #expect(ok.status == 0, "\(ok.stderr)")
            }
            #expect(generation(b, "cur") == 2)
            try? FileManager.default.removeItem(atPath: marker)

            try fp.enroll(user: "root", finger: "left-thumb", print: "print-thumb")
            let inval = b.cli(["rotate", "cur", "x"] + command, environment: ask)
            #expect(inval.status == 8 && inval.stdout.isEmpty, "\(inval.stderr)")
            #expect(!fp.waitUntilFingerNeeded(timeout: 0.5), "no prompt for an invalidated item")
            #expect(!FileManager.default.fileExists(atPath: marker), "COMMAND never ran")
            #expect(b.cli(["state", "cur", "x"]).stdoutText == "invalidated\n")
        }
    }
}
