import Foundation
import Glibc
import Testing
import KeyholdCore
@testable import KeyholdVault
import KeyholdTPM
import KeyholdTestSupport

/// Issue 36 item 3, existing vaults: a TPM vault from before the fix has a counter that
/// anyone who can open the TPM writes (TPMA_NV_AUTHWRITE, empty auth) and no protector
/// record. Its first start checks that counter as before (a copy behind it is refused), then
/// replaces it with one only the vault key's authorization writes.
@Suite(.serialized, .timeLimit(.minutes(5))) struct TPMLegacyCounterTests {
    /// Builds the pre-fix state the old code left: a vault whose key is sealed as is (the
    /// old migration re-sealed the same key), with a counter of the old kind at the vault's
    /// index whose value the vault records. Returns the index.
    func makeLegacyVault(_ b: BrokerFixture, _ tpm: SoftwareTPM, behindBy: UInt64) throws -> String {
        let keyPath = b.stateDirectory + "/vault.key"
        let keyBytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: keyPath)))
        let store = try VaultStore.open(stateDirectory: b.stateDirectory, passwordHashing: .interactive)
        let index = "0x" + String(store.defaultCounterIndex, radix: 16)
        let define = runWithTimeout("/usr/bin/tpm2_nvdefine", ["-T", tpm.tcti, index, "-s", "8", "-a", "nt=counter|authwrite|authread|no_da"], seconds: 30)
        #expect(define.status == 0, "\(define.stderr)")
        #expect(runWithTimeout("/usr/bin/tpm2_nvincrement", ["-T", tpm.tcti, index], seconds: 30).status == 0)
        let read = runWithTimeout("/usr/bin/tpm2_nvread", ["-T", tpm.tcti, "-C", index, "-s", "8", index], seconds: 30)
        let value = read.stdout.reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
        #expect(read.status == 0 && value > 0)
        try store.recordRollbackCounter(value - behindBy)
        store.close()
        let blob = try keyBytes.withUnsafeBytes { try TPMDevice(tcti: tpm.tcti).seal($0, pcrs: .none) }
        #expect(FileManager.default.createFile(atPath: b.stateDirectory + "/vault.key.tpm", contents: Data(blob.encoded),
                                               attributes: [.posixPermissions: 0o600]))
        #expect(unlink(keyPath) == 0)
        return index
    }

    @Test func legacyCounterIsCheckedThenReplaced() throws {
        let tpm = try SoftwareTPM()
        let b = try BrokerFixture(extraArguments: ["--key-protector", "file"])
        #expect(b.cli(["put", "svc", "acct"], stdin: Array("v".utf8)).status == 0)
        b.stop()
        let index = try makeLegacyVault(b, tpm, behindBy: 0)
        b.extraArguments = ["--key-protector", "auto", "--tpm-tcti", tpm.tcti]
        try b.start()
        expectSecret(b.cli(["get", "svc", "acct"]).stdoutText, equals: "v")
        b.stop()
        // The old counter is gone: its empty auth writes nothing now, and the broker starts again.
        #expect(runWithTimeout("/usr/bin/tpm2_nvincrement", ["-T", tpm.tcti, index], seconds: 30).status != 0)
        try b.start()
        #expect(b.cli(["rm", "svc", "acct"]).status == 0)
        b.stop()
    }

    @Test func legacyVaultBehindItsCounterIsRefused() throws {
        let tpm = try SoftwareTPM()
        let b = try BrokerFixture(extraArguments: ["--key-protector", "file"])
        #expect(b.cli(["put", "svc", "acct"], stdin: Array("v".utf8)).status == 0)
        b.stop()
        _ = try makeLegacyVault(b, tpm, behindBy: 1)
        let r = runWithTimeout(TestPaths.keyholdd, ["--state-dir", b.stateDirectory, "--socket", b.directory + "/once.sock",
                                                   "--syslog-socket", b.directory + "/no-log", "--tpm-tcti", tpm.tcti], seconds: 60)
        #expect(r.status == 13 && r.stderr.contains("restored from an older copy"), "\(r.status) \(r.stderr)")
    }
}
