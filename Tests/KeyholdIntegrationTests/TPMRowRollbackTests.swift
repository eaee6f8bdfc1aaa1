import Foundation
import Testing
import KeyholdVault
import KeyholdTestSupport

/// Issue 13: with the TPM protector (and its counter), a row-level rollback is still caught
/// as the item-generation record catches it: the counter is current (the head did not go
/// back), the older row fails *integrity*.
@Suite(.serialized, .timeLimit(.minutes(5))) struct TPMRowRollbackTests {
    @Test func olderRowPutBackIsIntegrityWithTheTPMProtector() throws {
        let tpm = try SoftwareTPM()
        let b = try BrokerFixture(extraArguments: ["--key-protector", "tpm", "--tpm-tcti", tpm.tcti])
        #expect(b.cli(["put", "victim", "acct"], stdin: Array("old-refresh-token".utf8)).status == 0)
        b.stop()
        do {
            let db = try Database(path: b.stateDirectory + "/vault.db")
            try db.execute("CREATE TABLE kept AS SELECT * FROM items")
            db.close()
        }
        try b.start()
        let tightened = b.cli(["put", "victim", "acct", "--update", "--policy", "device-passcode"], stdin: Array("new".utf8))
        #expect(tightened.status == 0, "\(tightened.stderr)")
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
        #expect(got.status == 13 && got.stdout.isEmpty, "\(got.status) \(got.stderr)")
        b.stop()
    }
}
