import Foundation
import Glibc
import Testing
import KeyholdTestSupport

/// Issue 36 item 3: only the broker moves its TPM counter. The attacker is a non-root member
/// of the TPM's group (`tss`, which may open /dev/tpmrm0 on Debian; here the swtpm sockets
/// are opened to that group the same way) running tpm2-tools against the counter.
@Suite(.serialized, .timeLimit(.minutes(10))) struct TPMCounterAuthorizationTests {
    let args: (SoftwareTPM) -> [String] = { ["--key-protector", "tpm", "--tpm-tcti", $0.tcti] }
    let running = TPMRunningBrokerTests()

    /// A throwaway user in group tss.
    func tssMember() throws -> TestUser {
        let user = try TestUser()
        let r = runCommand("/usr/sbin/usermod", ["-a", "-G", "tss", user.name])
        #expect(r.status == 0, "\(r.stderr)")
        return user
    }

    /// tpm2-tools as `user` against `tpm`.
    func tool(_ user: TestUser, _ tpm: SoftwareTPM, _ name: String, _ arguments: [String]) -> CommandResult {
        runCommand("/usr/bin/" + name, ["-T", tpm.tcti] + arguments, asUser: user.name)
    }

    /// A root-only credentials directory holding the owner password, as systemd's
    /// LoadCredential= gives the service (0500 directory, 0400 file).
    func ownerCredential(_ password: String, in directory: String) throws -> String {
        let dir = directory + "/credentials"
        #expect(mkdir(dir, 0o500) == 0)
        let file = dir + "/tpm-owner-auth"
        #expect(FileManager.default.createFile(atPath: file, contents: Data((password + "\n").utf8), attributes: [.posixPermissions: 0o400]))
        return dir
    }

    /// With an owner password (given to the broker as a systemd credential), a member of tss
    /// can neither increment nor undefine the counter, though it can open the TPM and see the
    /// counter; the broker starts, creates its vault, serves and moves the counter throughout.
    @Test func tssMemberCannotIncrementOrUndefineAndTheBrokerServesWithAnOwnerPassword() throws {
        let tpm = try SoftwareTPM()
        try tpm.shareWithGroup("tss")
        let user = try tssMember()
        try tpm.setOwnerPassword("owner-secret-1")
        let b = try BrokerFixture(environment: ["CREDENTIALS_DIRECTORY": try ownerCredential("owner-secret-1", in: TestPaths.temporaryDirectory("khc"))],
                                  extraArguments: args(tpm))
        #expect(b.cli(["put", "revoked", "token"], stdin: Array("old-token".utf8)).status == 0)
        #expect(b.cli(["put", "keep", "x"], stdin: Array("kept".utf8)).status == 0)
        #expect(b.cli(["rm", "revoked", "token"]).status == 0)
        let index = try #require(running.counterIndex(tpm))
        // The member reaches the TPM (the refusals below are authorization, not access).
        let seen = tool(user, tpm, "tpm2_getcap", ["handles-nv-index"])
        #expect(seen.status == 0 && seen.stdoutText.lowercased().contains(index.lowercased().replacingOccurrences(of: "0x0", with: "0x")), "\(seen.status) \(seen.stderr)")
        let before = try #require(ownerRead(tpm, index, password: "owner-secret-1"))

        for attempt in [["tpm2_nvincrement", index], ["tpm2_nvincrement", "-C", "o", index],
                        ["tpm2_nvundefine", index], ["tpm2_nvundefine", "-C", "o", index]] {
            let r = tool(user, tpm, attempt[0], Array(attempt.dropFirst()))
            #expect(r.status != 0, "\(attempt) as a member of tss succeeded")
        }
        // Not even the owner password's holder increments it (no owner write).
        let ownerFile = b.directory + "/owner-pw"
        #expect(FileManager.default.createFile(atPath: ownerFile, contents: Data("owner-secret-1".utf8), attributes: [.posixPermissions: 0o600]))
        let byOwner = runWithTimeout("/usr/bin/tpm2_nvincrement", ["-T", tpm.tcti, "-C", "o", "-P", "file:" + ownerFile, index], seconds: 30)
        #expect(byOwner.status != 0, "the owner hierarchy incremented the counter")
        #expect(ownerRead(tpm, index, password: "owner-secret-1") == before)

        // The broker went on serving, moves the counter, and starts again with the password.
        usleep(1_300_000)
        expectSecret(b.cli(["get", "keep", "x"]).stdoutText, equals: "kept")
        #expect(b.cli(["rm", "keep", "x"]).status == 0)
        #expect(ownerRead(tpm, index, password: "owner-secret-1") == before + 1)
        b.stop()
        try b.start()
        #expect(b.cli(["put", "again", "x"], stdin: Array("a".utf8)).status == 0)
        #expect(b.cli(["get", "revoked", "token"]).status == 3)
        b.stop()
        // Without the credential the TPM refuses the broker: nothing is served.
        b.extraEnvironment = [:]
        #expect(throws: (any Error).self) { try b.start() }
    }

    /// With an empty owner authorization (a fresh TPM's), a member of tss can undefine the
    /// counter. The broker notices, while running and at the next start, and refuses with
    /// *integrity*: the older copy put back with it is never served, not even after the member
    /// defines a counter of its own at the index. Until the administrator accepts (audited).
    @Test func undefinedCounterIsRefusedNeverReset() throws {
        let tpm = try SoftwareTPM()
        try tpm.shareWithGroup("tss")
        let user = try tssMember()
        let b = try BrokerFixture(extraArguments: args(tpm))
        #expect(b.cli(["put", "revoked", "token"], stdin: Array("old-token".utf8)).status == 0)
        b.stop()
        let snapshot = b.directory + "/snapshot"
        #expect(runCommand("/bin/cp", ["-a", b.stateDirectory, snapshot]).status == 0)
        try b.start()
        #expect(b.cli(["rm", "revoked", "token"]).status == 0)
        let index = try #require(running.counterIndex(tpm))

        // While the broker runs.
        #expect(tool(user, tpm, "tpm2_nvundefine", [index]).status == 0)
        usleep(1_300_000)
        let get = b.cli(["ls"])
        #expect(get.status == 13 && get.stderr.contains("integrity failure"), "\(get.status) \(get.stderr)")
        b.stop()

        // The older copy put back, and a counter of the member's own at the index (its value
        // whatever the TPM gives a new counter): refused at every start.
        #expect(runCommand("/bin/rm", ["-rf", b.stateDirectory]).status == 0)
        #expect(runCommand("/bin/cp", ["-a", snapshot, b.stateDirectory]).status == 0)
        let once = { runWithTimeout(TestPaths.keyholdd, ["--state-dir", b.stateDirectory, "--socket", b.directory + "/once.sock",
                                                         "--syslog-socket", b.directory + "/no-log"] + args(tpm), seconds: 60) }
        let removed = once()
        #expect(removed.status == 13 && removed.stderr.contains("no counter"), "\(removed.status) \(removed.stderr)")
        #expect(tool(user, tpm, "tpm2_nvdefine", [index, "-s", "8", "-a", "nt=counter|authwrite|authread|ownerread|no_da"]).status == 0)
        #expect(tool(user, tpm, "tpm2_nvincrement", [index]).status == 0)
        let replaced = once()
        #expect(replaced.status == 13 && replaced.stderr.contains("did not make"), "\(replaced.status) \(replaced.stderr)")
        #expect(throws: (any Error).self) { try b.start() }
        #expect(b.cli(["get", "revoked", "token"]).stdout.isEmpty)

        // The administrator's decision: audited, a counter of the vault's own again.
        b.extraArguments = args(tpm) + ["--accept-rollback"]
        try b.start()
        #expect(b.cli(["audit", "--json"]).stdoutText.contains("accept-rollback"))
        b.stop()
        b.extraArguments = args(tpm)
        try b.start()
        #expect(tool(user, tpm, "tpm2_nvincrement", [index]).status != 0, "the member's counter was kept")
        b.stop()
    }

    /// The counter's value read through the owner hierarchy with its password (tpm2_nvread).
    func ownerRead(_ tpm: SoftwareTPM, _ index: String, password: String) -> UInt64? {
        let file = TestPaths.temporaryDirectory("khp") + "/pw"
        FileManager.default.createFile(atPath: file, contents: Data(password.utf8), attributes: [.posixPermissions: 0o600])
        let r = runWithTimeout("/usr/bin/tpm2_nvread", ["-T", tpm.tcti, "-C", "o", "-P", "file:" + file, "-s", "8", index], seconds: 30)
        guard r.status == 0, r.stdout.count == 8 else { return nil }
        return r.stdout.reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
    }
}
