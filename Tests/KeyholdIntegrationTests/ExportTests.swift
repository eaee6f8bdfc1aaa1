import Foundation
import Glibc
import Testing
import KeyholdTestSupport

/// `keyhold export` through the real broker: every item released under its policy (a gated one
/// prompts, or is skipped with --no-interaction), audited as a release, written as JSON Lines to
/// a new 0600 file that is never replaced, or encrypted by the real `age` and decrypted back
/// with `age -d`.
@Suite struct ExportTests {
    static let secrets = ["open": "ex-open-\u{e9}\n\u{0}bytes", "gated": "ex-gated-77", "pinned": "ex-pinned-12"]

    /// A user with three items: policy none, device-passcode (gated), and --allow-exe /bin/true.
    func populated(_ b: BrokerFixture, _ user: TestUser) {
        #expect(b.cli(["put", "svc", "open", "--label", "L1", "--kind", "refresh-token", "--expires", "2030-01-01"],
                      stdin: Array(Self.secrets["open"]!.utf8), asUser: user.name).status == 0)
        #expect(b.cli(["put", "svc", "gated", "--policy", "device-passcode", "--reuse", "60"],
                      stdin: Array(Self.secrets["gated"]!.utf8), asUser: user.name).status == 0)
        #expect(b.cli(["put", "svc", "pinned", "--allow-exe", "/bin/true"],
                      stdin: Array(Self.secrets["pinned"]!.utf8), asUser: user.name).status == 0)
    }

    func lines(_ bytes: [UInt8]) throws -> [[String: Any]] {
        try String(decoding: bytes, as: UTF8.self).split(separator: "\n").map {
            try #require(try JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any])
        }
    }

    func secret(_ line: [String: Any]) -> [UInt8]? {
        (line["secret"] as? String).flatMap { Data(base64Encoded: $0) }.map { [UInt8]($0) }
    }

    @Test func exportWritesANewPrivateFileAndSkipsWhatNeedsAPrompt() throws {
        let b = try BrokerFixture(passwords: ["root": "right-password"])
        let user = try TestUser()
        try b.setPasswords([user.name: "user-password"])
        populated(b, user)
        let dir = try ImportFiles.ownedDirectory(by: user)
        let file = dir + "/out.jsonl"

        let r = b.cli(["export", file, "--no-interaction"], asUser: user.name)
        #expect(r.status == 0, "\(r.stderr)")
        #expect(r.stdoutText == "exported 1, skipped 2, failed 0\n", "\(r.stderr)")
        for s in Self.secrets.values { #expect(!r.stdoutText.contains(s) && !r.stderr.contains(s)) }
        var st = stat()
        #expect(stat(file, &st) == 0 && st.st_mode & 0o777 == 0o600 && st.st_uid == user.uid)
        let got = try lines(Array(try Data(contentsOf: URL(fileURLWithPath: file))))
        #expect(got.count == 1)
        #expect(got.first?["service"] as? String == "svc" && got.first?["account"] as? String == "open")
        #expect(got.first?["label"] as? String == "L1" && got.first?["kind"] as? String == "refresh-token")
        #expect(got.first?["policy"] as? String == "none" && got.first?["expires"] as? String == "2030-01-01T00:00:00.000000Z")
        expectSecret(got.first.flatMap(secret), equals: Array(Self.secrets["open"]!.utf8))

        // Never replaced: a second export to the same path (or through a symlink) changes nothing.
        let before = try Data(contentsOf: URL(fileURLWithPath: file))
        let again = b.cli(["export", file, "--no-interaction"], asUser: user.name)
        #expect(again.status == 1 && again.stderr.contains("never replaces"), "\(again.stderr)")
        #expect(try Data(contentsOf: URL(fileURLWithPath: file)) == before)
        symlink(dir + "/elsewhere", dir + "/link")
        #expect(b.cli(["export", dir + "/link", "--no-interaction"], asUser: user.name).status == 1)
        #expect(access(dir + "/elsewhere", F_OK) != 0)

        // With a way to prompt, the gated item is released after the password (the pinned one
        // still is not: keyhold is not /bin/true), each release audited with the reason.
        let ask = b.askpass(answering: "user-password", name: "ask-export")
        let prompted = b.cli(["export", dir + "/all.jsonl", "--reason", "moving out"], environment: ["KEYHOLD_ASKPASS": ask], asUser: user.name)
        #expect(prompted.stdoutText == "exported 2, skipped 1, failed 0\n", "\(prompted.stderr)")
        let all = try lines(Array(try Data(contentsOf: URL(fileURLWithPath: dir + "/all.jsonl"))))
        let gated = all.first { $0["account"] as? String == "gated" }
        #expect(gated?["policy"] as? String == "device-passcode" && gated?["reuse_seconds"] as? Int == 60)
        expectSecret(gated.flatMap(secret), equals: Array(Self.secrets["gated"]!.utf8))
        let audit = b.cli(["audit", "--json", "--item", "svc/gated"], asUser: user.name).stdoutText
        #expect(audit.contains("\"operation\":\"get\"") && audit.contains("moving out") && audit.contains("\"granted\""), "\(audit)")
    }

    @Test func exportThroughAgeDecryptsBack() throws {
        let b = try BrokerFixture()
        let user = try TestUser()
        populated(b, user)
        let dir = try ImportFiles.ownedDirectory(by: user)
        let key = dir + "/age.key"
        #expect(runCommand("/usr/bin/age-keygen", ["-o", key], asUser: user.name).status == 0)
        let recipient = runCommand("/usr/bin/age-keygen", ["-y", key], asUser: user.name).stdoutText
            .trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(recipient.hasPrefix("age1"))

        let file = dir + "/out.age"
        let r = b.cli(["export", file, "--recipient", recipient, "--no-interaction"], asUser: user.name)
        #expect(r.status == 0, "\(r.stderr)")
        #expect(r.stdoutText == "exported 1, skipped 2, failed 0\n")
        var st = stat()
        #expect(stat(file, &st) == 0 && st.st_mode & 0o777 == 0o600)
        let sealed = try Data(contentsOf: URL(fileURLWithPath: file))
        #expect(sealed.starts(with: Data("age-encryption.org/v1".utf8)))
        #expect(sealed.range(of: Data("ex-open".utf8)) == nil, "no clear secret on disk")

        let plain = runCommand("/usr/bin/age", ["-d", "-i", key, file], asUser: user.name)
        #expect(plain.status == 0, "\(plain.stderr)")
        let got = try lines(plain.stdout)
        #expect(got.count == 1 && got.first?["account"] as? String == "open")
        expectSecret(got.first.flatMap(secret), equals: Array(Self.secrets["open"]!.utf8))

        // A recipient age refuses: nothing is left behind.
        let bad = b.cli(["export", dir + "/bad.age", "--recipient", "age1notarecipient", "--no-interaction"], asUser: user.name)
        #expect(bad.status == 1, "\(bad.stderr)")
        #expect(access(dir + "/bad.age", F_OK) != 0)
    }
}
