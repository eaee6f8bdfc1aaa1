import Foundation
import Testing
import KeyholdCore
import KeyholdVault
import KeyholdTestSupport

/// Issue 8, item 6, through the real broker and CLI: someone who can write vault.db while the
/// broker is down saves an item's row while its policy is `none` and puts it back after the
/// owner tightened the policy. Before generations it opened without a prompt.
@Suite(.serialized) struct StoreThroughBrokerGenerationTests {
    @Test func olderRowPutBackAfterPolicyTightenedFailsIntegrity() throws {
        let b = try BrokerFixture()
        #expect(b.cli(["put", "victim", "acct"], stdin: Array("old-refresh-token".utf8)).status == 0)
        #expect(b.cli(["put", "other", "acct"], stdin: Array("other-token".utf8)).status == 0)
        b.stop()
        do {
            let db = try Database(path: b.stateDirectory + "/vault.db")
            try db.execute("CREATE TABLE kept AS SELECT * FROM items")
            db.close()
        }
        try b.start()
        let tightened = b.cli(["put", "victim", "acct", "--update", "--policy", "device-passcode"],
                              stdin: Array("new-refresh-token".utf8))
        #expect(tightened.status == 0, "\(tightened.stderr)")
        let ls = b.cli(["ls", "--json"]).stdoutText
        #expect(ls.contains("\"generation\":2") && ls.contains("\"generation\":1"), "\(ls)")
        b.stop()
        do {
            let db = try Database(path: b.stateDirectory + "/vault.db")
            let columns = "lookup, kind, policy, allowed_executables, reuse_seconds, biometry_state, pwhash_params, attributes, wrapped_key, secret, created_us, updated_us, generation"
            try db.execute("""
                UPDATE items SET (\(columns)) = (SELECT \(columns) FROM kept WHERE kept.id = items.id);
                DROP TABLE kept;
                """)
            db.close()
        }
        try b.start()
        let got = b.cli(["get", "victim", "acct", "--no-interaction"])
        #expect(got.status == 13, "\(got.stderr)")
        #expect(got.stdout.count == 0)
        // The other item's row was put back unchanged (same generation): it still opens.
        expectSecret(b.cli(["get", "other", "acct"]).stdoutText, equals: "other-token")
    }
}
