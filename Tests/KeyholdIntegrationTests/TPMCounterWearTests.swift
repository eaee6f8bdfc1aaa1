import Foundation
import Glibc
import Testing
import KeyholdTestSupport

/// Counter wear, measured: NV increments of the vault's TPM counter (read with tpm2-tools
/// before and after) over a scripted "typical desktop day". The script's numbers are
/// assumptions, stated in SECURITY.md "Counter wear" with the result this test prints:
///
/// - one broker start (boot) and one restart;
/// - 5 new items (`put`);
/// - 120 reads of ungated items (git/docker credential helpers, apps' tokens through the
///   Secret Service at their start) and 6 of a gated item with the right password;
/// - 30 rotations (`put --update`: three apps refreshing an OAuth token hourly over ten hours);
/// - 2 deletes (`rm`);
/// - 3 failed attempts (mistyped passwords);
/// - no audit prune (an administrator's monthly job, one increment when it runs).
@Suite(.serialized, .timeLimit(.minutes(10))) struct TPMCounterWearTests {
    @Test func scriptedDesktopDay() throws {
        let tpm = try SoftwareTPM()
        let b = try BrokerFixture(extraArguments: ["--key-protector", "tpm", "--tpm-tcti", tpm.tcti])
        let right = b.askpass(answering: "right-password", name: "right")
        let wrong = b.askpass(answering: "typo", name: "wrong")
        let index = try #require(TPMRunningBrokerTests().counterIndex(tpm))
        func value() -> UInt64 { TPMRunningBrokerTests().counterValue(tpm, index) ?? 0 }
        let start = value()

        for i in 0..<4 { #expect(b.cli(["put", "app\(i).example", "me"], stdin: Array("t0".utf8)).status == 0) }
        #expect(b.cli(["put", "bank.example", "me", "--policy", "device-passcode"], stdin: Array("g".utf8)).status == 0)
        for i in 0..<120 { #expect(b.cli(["get", "app\(i % 4).example", "me"]).status == 0) }
        for _ in 0..<6 { #expect(b.cli(["get", "bank.example", "me"], environment: ["KEYHOLD_ASKPASS": right]).status == 0) }
        b.stop()
        try b.start()
        let afterReads = value()
        #expect(afterReads == start, "new items, reads and a restart moved the counter by \(afterReads - start)")

        for i in 0..<30 { #expect(b.cli(["put", "app\(i % 3).example", "me", "--update"], stdin: Array("t\(i + 1)".utf8)).status == 0) }
        let afterRotations = value()
        for i in 2..<4 { #expect(b.cli(["rm", "app\(i).example", "me"]).status == 0) }
        let afterDeletes = value()
        for _ in 0..<3 { #expect(b.cli(["get", "bank.example", "me"], environment: ["KEYHOLD_ASKPASS": wrong]).status == 6) }
        let afterFailures = value()
        b.stop()

        let total = afterFailures - start
        print("TPM counter wear, scripted desktop day: \(total) NV increments (rotations \(afterRotations - afterReads) for 30, deletes \(afterDeletes - afterRotations) for 2, failed attempts \(afterFailures - afterDeletes) for 3; 5 new items, 126 reads and a restart: \(afterReads - start))")
        #expect(afterRotations - afterReads == 30)
        #expect(afterDeletes - afterRotations == 2)
        #expect(afterFailures - afterDeletes == 3)
    }
}
