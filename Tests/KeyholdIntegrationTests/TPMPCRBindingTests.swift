import Foundation
import Glibc
import Testing
import KeyholdTestSupport

/// Issue 13: `keyholdd --tpm-pcrs LIST` end to end. The key is sealed to PCRs 7 and 16 (16 is
/// the debug PCR, which tpm2-tools may extend and reset at locality 0); extending 16 stands in
/// for a firmware or kernel update. Every step is bounded (runWithTimeout, the fixture's start).
@Suite(.serialized, .timeLimit(.minutes(5))) struct TPMPCRBindingTests {
    let secret = "pcr-bound-secret-v1"

    func pcr16(_ tpm: SoftwareTPM) -> String {
        runWithTimeout("/usr/bin/tpm2_pcrread", ["-T", tpm.tcti, "sha256:16"], seconds: 30).stdoutText
    }

    /// The broker-start entries of the audit, oldest first.
    func starts(_ b: BrokerFixture) -> [Substring] {
        b.cli(["audit", "--json"]).stdoutText.split(separator: "\n").filter { $0.contains("broker-start") }
    }

    @Test func changedPCRRefusesTheStartAndTheAuditNamesThePCRs() throws {
        let tpm = try SoftwareTPM()
        let plain = ["--key-protector", "tpm", "--tpm-tcti", tpm.tcti]
        let b = try BrokerFixture(extraArguments: plain + ["--tpm-pcrs", "16,7"])
        #expect(b.cli(["put", "svc", "acct"], stdin: Array(secret.utf8)).status == 0)
        b.stop()
        try b.start()
        expectSecret(b.cli(["get", "svc", "acct"]).stdoutText, equals: secret)
        #expect(starts(b).last?.contains("key-protector=tpm pcrs=7,16") == true, "\(starts(b))")
        b.stop()
        // Without --tpm-pcrs the key is still the one bound to 7,16, and the audit says so.
        b.extraArguments = plain
        try b.start()
        expectSecret(b.cli(["get", "svc", "acct"]).stdoutText, equals: secret)
        #expect(starts(b).last?.contains("key-protector=tpm pcrs=7,16") == true, "\(starts(b))")
        #expect(b.brokerLog.contains("sealed by this machine's TPM (bound to PCRs 7,16)"), "\(b.brokerLog)")
        b.stop()
        // Another list for an existing key is ignored, and the start-up line says so.
        b.extraArguments = plain + ["--tpm-pcrs", "7"]
        try b.start()
        expectSecret(b.cli(["get", "svc", "acct"]).stdoutText, equals: secret)
        #expect(b.brokerLog.contains("--tpm-pcrs 7 is ignored: the key is already sealed"), "\(b.brokerLog)")
        b.stop()
        b.extraArguments = plain

        let before = pcr16(tpm)
        try tpm.extendPCR(16)
        #expect(pcr16(tpm) != before, "tpm2_pcrextend did not change PCR 16: \(before)")
        let refused = runWithTimeout(TestPaths.keyholdd, ["--state-dir", b.stateDirectory, "--socket", b.directory + "/once.sock",
                                                          "--syslog-socket", b.directory + "/no-log"] + plain, seconds: 60)
        print("refused start after PCR 16 changed: \(refused.status) \(refused.stderr)")
        #expect(refused.status == 13 && refused.stdout.isEmpty, "\(refused.status) \(refused.stderr)")
        #expect(refused.stderr.contains("sealed to the values of PCRs 7,16") && refused.stderr.contains("changed"), "\(refused.stderr)")
        #expect(refused.stderr.contains("re-seal") && refused.stderr.contains("--migrate-key-protector file"), "\(refused.stderr)")
        #expect(!refused.stderr.contains(secret))
        #expect(throws: (any Error).self) { try b.start() }
        #expect(!b.brokerLog.contains(secret))
        #expect(b.cli(["get", "svc", "acct"]).stdout.count == 0)

        // The old measurement back (PCR 16 reset): the same key opens again, nothing lost.
        let reset = runWithTimeout("/usr/bin/tpm2_pcrreset", ["-T", tpm.tcti, "16"], seconds: 30)
        #expect(reset.status == 0, "\(reset.stderr)")
        #expect(pcr16(tpm) == before)
        try b.start()
        expectSecret(b.cli(["get", "svc", "acct"]).stdoutText, equals: secret)
        b.stop()
    }
}
