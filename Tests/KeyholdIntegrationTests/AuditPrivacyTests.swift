import Foundation
import Testing
import KeyholdCore
import KeyholdVault
import KeyholdTestSupport

/// Issue 8, item 9: an unprivileged user's `audit` and `audit verify` reveal nothing of root's
/// (or anyone else's) activity: not a count, not a gap in sequence numbers. The chain is still
/// checked over every entry.
@Suite(.serialized) struct AuditPrivacyTests {
    func entries(_ b: BrokerFixture, asUser user: String? = nil) -> [[String: Any]] {
        b.cli(["audit", "--json"], asUser: user).stdoutText.split(separator: "\n").compactMap {
            try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]
        }
    }

    func seqs(_ rows: [[String: Any]]) -> [Int] { rows.compactMap { $0["seq"] as? Int } }

    func rootActs(_ b: BrokerFixture, _ n: Int, tag: String) {
        for i in 0..<n { b.cli(["put", "root-\(tag)-\(i)", "x"], stdin: [1]); b.cli(["get", "root-\(tag)-\(i)", "x"]) }
    }

    @Test func nonRootVerifyAndListingRevealNothingOfRootsActivity() throws {
        let user = try TestUser()
        let b = try BrokerFixture()
        rootActs(b, 3, tag: "a")
        #expect(b.cli(["put", "mine", "x"], stdin: [2], asUser: user.name).status == 0)
        rootActs(b, 4, tag: "b")
        #expect(b.cli(["get", "mine", "x"], asUser: user.name).status == 0)

        // The user's own entries (put, get, this audit read), numbered 1, 2, 3 among their own:
        // no gap where root acted.
        let before = entries(b, asUser: user.name)
        #expect(seqs(before) == [1, 2, 3], "\(before)")
        #expect(before.allSatisfy { $0["uid"] as? Int == Int(user.uid) })

        // verify counts the user's own entries only (put, get, the audit read above).
        let verify = b.cli(["audit", "verify"], asUser: user.name)
        #expect(verify.status == 0 && verify.stdoutText == "audit chain verified: 3 entries\n", "\(verify.stdoutText)")

        // Root acts a lot; the user's view moves only by their own requests.
        rootActs(b, 10, tag: "c")
        let after = entries(b, asUser: user.name)
        // put, get, audit read, audit verify, and this audit read: 1…5, nothing skipped.
        #expect(seqs(after) == [1, 2, 3, 4, 5], "\(seqs(after))")
        let again = b.cli(["audit", "verify"], asUser: user.name)
        #expect(again.stdoutText == "audit chain verified: 5 entries\n", "\(again.stdoutText)")
        #expect(!again.stdoutText.contains("root"))

        // Root still sees the whole log, with its own numbering.
        let all = entries(b)
        #expect(all.count > 40 && seqs(all) == Array(1...all.count))
        let rootVerify = b.cli(["audit", "verify"])
        #expect(rootVerify.stdoutText == "audit chain verified: \(all.count) entries\n", "\(rootVerify.stdoutText)")
    }

    @Test func theChainIsStillCheckedOverEveryoneElsesEntries() throws {
        let user = try TestUser()
        let b = try BrokerFixture()
        rootActs(b, 2, tag: "a")
        #expect(b.cli(["put", "mine", "x"], stdin: [2], asUser: user.name).status == 0)
        b.stop()
        do {
            // Alter one of root's entries: the user's verify must fail, without saying where.
            let db = try Database(path: b.stateDirectory + "/vault.db")
            try db.execute("UPDATE audit SET executable = '/usr/bin/other' WHERE seq = 2")
            db.close()
        }
        try b.start()
        let v = b.cli(["audit", "verify"], asUser: user.name)
        #expect(v.status == 13 && v.stdoutText == "audit chain BROKEN: altered\n", "\(v.stdoutText)")
        let root = b.cli(["audit", "verify"])
        #expect(root.status == 13 && root.stdoutText == "audit chain BROKEN at entry 2: altered\n", "\(root.stdoutText)")
    }
}
