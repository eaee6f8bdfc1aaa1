import Foundation
import Testing
import KeyholdTestSupport

/// "The client holds no keys" is enforced by the build: `keyhold` links the model
/// (KeyholdCore) but not the vault (KeyholdVault), so no store, key or SQLite code is in it.
@Suite struct ClientBinaryTests {
    static func contents(_ path: String) throws -> Data {
        try Data(contentsOf: URL(fileURLWithPath: path))
    }

    static func has(_ data: Data, _ text: String) -> Bool { data.range(of: Data(text.utf8)) != nil }

    @Test func theCLICarriesNoVaultOrSQLiteCode() throws {
        let cli = try Self.contents(TestPaths.keyhold)
        // Positive control: the symbol table is searchable (the model's mangled module name is in it).
        #expect(Self.has(cli, "11KeyholdCore"))
        #expect(!Self.has(cli, "12KeyholdVault"))
        #expect(!Self.has(cli, "sqlite3_prepare"))
        #expect(!Self.has(cli, "libsqlite3"))
        // And the same search does find the vault in the broker, which must carry it.
        let broker = try Self.contents(TestPaths.keyholdd)
        #expect(Self.has(broker, "12KeyholdVault"))
        #expect(Self.has(broker, "libsqlite3"))
    }

    /// The PAM helper runs third-party modules as root: it carries neither the vault nor
    /// SQLite, the TPM stack or libcrypto, only PAM and the model.
    @Test func thePAMHelperCarriesNoVault() throws {
        let helper = try Self.contents(TestPaths.pamHelper)
        #expect(Self.has(helper, "16KeyholdPAMHelper"))
        #expect(Self.has(helper, "libpam"))
        for absent in ["12KeyholdVault", "13KeyholdBroker", "libsqlite3", "libtss2", "libcrypto"] {
            #expect(!Self.has(helper, absent), "\(absent)")
        }
    }

    /// The broker runs PAM only through the helper, so it does not map libpam at all.
    @Test func theBrokerDoesNotLinkLibPAM() throws {
        #expect(!Self.has(try Self.contents(TestPaths.keyholdd), "libpam.so"))
        #expect(Self.has(try Self.contents(TestPaths.pamHelper), "libpam.so"))
    }

    /// Root keeps no D-Bus client: the hand-written one (SASL EXTERNAL) is in the CLI only.
    @Test func theBrokerCarriesNoDBusClient() throws {
        #expect(Self.has(try Self.contents(TestPaths.keyhold), "AUTH EXTERNAL"))
        #expect(!Self.has(try Self.contents(TestPaths.keyholdd), "AUTH EXTERNAL"))
    }

    /// The CLI is linked statically (start-up cost; README "Benchmark"): no program interpreter.
    @Test func theCLIIsStaticallyLinked() throws {
        let cli = try Self.contents(TestPaths.keyhold)
        #expect(!Self.has(cli, "/lib64/ld-linux"))
        #expect(!Self.has(cli, "libswiftCore.so"))
    }
}
