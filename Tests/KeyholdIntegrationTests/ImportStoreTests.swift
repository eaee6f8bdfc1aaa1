import Foundation
import Glibc
import Testing
import KeyholdTestSupport

/// `keyhold import pass` and `import keepassxc` against stores the test makes with the real
/// tools (pass over gpg with a test key without passphrase in a private GNUPGHOME; a KeePassXC
/// database made by keepassxc-cli, every password through stdin), run twice by an unprivileged
/// user through the real broker.
@Suite struct ImportStoreTests {
    // MARK: pass

    /// A pass store of `user`'s, made by `pass` itself; its GNUPGHOME's agent is stopped on deinit.
    final class PassStore {
        let user: TestUser
        let home: String
        var store: String { home + "/.password-store" }
        var environment: [String: String] { ["HOME": home, "GNUPGHOME": home + "/g", "PASSWORD_STORE_DIR": store] }

        init(_ user: TestUser) throws {
            self.user = user
            home = try ImportFiles.ownedDirectory(by: user)
            mkdir(home + "/g", 0o700)
            chown(home + "/g", user.uid, gid_t(getpwnam(user.name).pointee.pw_gid))
            try run("/usr/bin/gpg", ["--batch", "--passphrase", "", "--quick-gen-key", "Keyhold Import Test <import@example.invalid>",
                                     "default", "default", "never"])
            try run("/usr/bin/pass", ["init", "import@example.invalid"])
        }

        /// `pass insert -m NAME`, the content through stdin.
        func insert(_ name: String, _ content: String) throws {
            try run("/usr/bin/pass", ["insert", "-m", name], stdin: content)
        }

        func run(_ path: String, _ args: [String], stdin: String = "") throws {
            let r = runCommand(path, args, stdin: Array(stdin.utf8), environment: environment, asUser: user.name)
            guard r.status == 0 else { throw FixtureError.brokerDidNotStart("\(path) \(args.first ?? ""): \(r.stderr)") }
        }

        deinit { runCommand("/usr/bin/gpgconf", ["--kill", "gpg-agent"], environment: environment, asUser: user.name) }
    }

    static let passEntries = [
        ("email/example.com", "pw-one-7f3\nlogin: alice\nurl: https://example.com\n"),
        ("web/bob", "pw-two-a91\n"),
        ("top", "pw-three-0c2"),
    ]

    @Test func passStoreImportedTwice() throws {
        let b = try BrokerFixture()
        let user = try TestUser()
        let pass = try PassStore(user)
        for (name, content) in Self.passEntries { try pass.insert(name, content) }
        let before = try ImportFiles.snapshot(pass.store)

        let first = b.cli(["import", "pass"], environment: pass.environment, asUser: user.name)
        #expect(first.status == 0, "\(first.stderr)")
        #expect(first.stdoutText == "imported 3, already present 0, failed 0\n", "\(first.stderr)")
        let second = b.cli(["import", "pass", "--store", pass.store], environment: pass.environment, asUser: user.name)
        #expect(second.stdoutText == "imported 0, already present 3, failed 0\n", "\(second.stderr)")
        #expect(try ImportFiles.snapshot(pass.store) == before, "the store is unchanged")
        for r in [first, second] { ImportFiles.expectNoSecret(r, ["pw-one", "pw-two", "pw-three"]) }

        // Named by the login line, else the entry's name; the secret is the entry as `pass show` prints it.
        for (service, account, content) in [("pass:email/example.com", "alice", Self.passEntries[0].1),
                                            ("pass:web/bob", "bob", Self.passEntries[1].1), ("pass:top", "top", Self.passEntries[2].1)] {
            let got = b.cli(["get", service, account], asUser: user.name)
            #expect(got.status == 0, "\(service): \(got.stderr)")
            expectSecret(got.stdoutText, equals: content)
            let shown = runCommand("/usr/bin/pass", ["show", String(service.dropFirst(5))], environment: pass.environment, asUser: user.name)
            expectSecret(shown.stdout, equals: got.stdout)
        }

        // New entries sorted between the imported ones: only they are decrypted (four gpg at a
        // time, in the order they are stored), each under its own name.
        for i in 0..<9 { try pass.insert("email/n\(i)", "pw-new-\(i)\nuser: n\(i)\n") }
        let third = b.cli(["import", "pass"], environment: pass.environment, asUser: user.name)
        #expect(third.stdoutText == "imported 9, already present 3, failed 0\n", "\(third.stderr)")
        for i in 0..<9 { expectSecret(b.cli(["get", "pass:email/n\(i)", "n\(i)"], asUser: user.name).stdoutText, equals: "pw-new-\(i)\nuser: n\(i)\n") }
    }

    @Test func passEntriesGpgCannotOpenFailAloneAndThePolicyHolds() throws {
        let b = try BrokerFixture()
        let user = try TestUser()
        let pass = try PassStore(user)
        try pass.insert("good", "pw-good-55\n")
        // Encrypted to nobody this keyring can open: a corrupt entry.
        try ImportFiles.write(pass.store + "/broken.gpg", owner: user, "not an OpenPGP message")
        let r = b.cli(["import", "pass", "--policy", "device-passcode"], environment: pass.environment, asUser: user.name)
        #expect(r.status == 1)
        #expect(r.stdoutText == "imported 1, already present 0, failed 1\n", "\(r.stderr)")
        #expect(r.stderr.contains("broken: gpg could not decrypt it"), "\(r.stderr)")
        #expect(b.cli(["get", "pass:good", "good"], asUser: user.name).status == 7, "gated: no way to prompt")
        #expect(b.cli(["import", "pass", "--store", pass.home + "/none"], environment: pass.environment, asUser: user.name).status == 1)
    }

    // MARK: KeePassXC

    static let databasePassword = "db-pass-4e1"

    /// A database of `user`'s with `entries` (group path, title, user, url, notes, password).
    static func keepassDatabase(_ user: TestUser, _ entries: [(String, String, String, String, String?, String)]) throws -> String {
        let dir = try ImportFiles.ownedDirectory(by: user)
        let db = dir + "/vault.kdbx"
        func cli(_ args: [String], stdin: String) throws {
            let r = runCommand("/usr/bin/keepassxc-cli", args, stdin: Array(stdin.utf8), environment: ["HOME": dir], asUser: user.name)
            guard r.status == 0 else { throw FixtureError.brokerDidNotStart("keepassxc-cli \(args[0]): \(r.stderr)") }
        }
        let pw = databasePassword + "\n"
        try cli(["db-create", "-q", "--set-password", "--decryption-time", "100", db], stdin: pw + pw)
        var groups = Set<String>()
        for (group, title, username, url, notes, password) in entries {
            if !group.isEmpty && groups.insert(group).inserted { try cli(["mkdir", "-q", db, group], stdin: pw) }
            var args = ["add", "-q", "--password-prompt", "--username", username, "--url", url]
            if let notes { args += ["--notes", notes] }
            try cli(args + [db, group.isEmpty ? title : group + "/" + title], stdin: pw + password + "\n")
        }
        return db
    }

    static let keepassEntries: [(String, String, String, String, String?, String)] = [
        ("Internet", "GitHub", "alice", "https://github.com", "recovery codes in the safe", "kp-one,\"quoted\" 8b"),
        ("Internet", "Mail", "", "https://mail.example.com", nil, "kp-two-\u{e9}"),
        ("", "Wifi", "guest", "", nil, "kp-three-31"),
    ]

    @Test func keepassDatabaseImportedTwice() throws {
        let b = try BrokerFixture()
        let user = try TestUser()
        let db = try Self.keepassDatabase(user, Self.keepassEntries + [("", "Old", "old", "", nil, "kp-old-5d")])
        // Deleted in KeePassXC: moved to its recycle bin, which is not moved in.
        let rm = runCommand("/usr/bin/keepassxc-cli", ["rm", "-q", db, "Old"], stdin: Array((Self.databasePassword + "\n").utf8), asUser: user.name)
        #expect(rm.status == 0, "\(rm.stderr)")
        let before = try ImportFiles.snapshot((db as NSString).deletingLastPathComponent)

        let first = b.cli(["import", "keepassxc", db], stdin: Array((Self.databasePassword + "\n").utf8), asUser: user.name)
        #expect(first.status == 0, "\(first.stderr)")
        #expect(first.stdoutText.hasPrefix("imported 3, already present 0, failed 0, skipped 1\n"), "\(first.stdoutText) \(first.stderr)")
        #expect(first.stderr.contains("(Old): skipped: in the recycle bin"), "\(first.stderr)")
        #expect(first.stdoutText.contains("1 imported entries also have notes"), "\(first.stdoutText)")
        let second = b.cli(["import", "keepassxc", db], stdin: Array((Self.databasePassword + "\n").utf8), asUser: user.name)
        #expect(second.stdoutText.hasPrefix("imported 0, already present 3, failed 0, skipped 1\n"), "\(second.stdoutText) \(second.stderr)")
        #expect(try ImportFiles.snapshot((db as NSString).deletingLastPathComponent) == before, "the database is unchanged")
        for r in [first, second] { ImportFiles.expectNoSecret(r, ["kp-one", "kp-two", "kp-three", "kp-old", Self.databasePassword]) }

        let items = ImportFiles.items(b, asUser: user.name)
        #expect(items.count == 3)
        // The root group is the database's name (keepassxc-cli's default: "Passwords").
        for (service, account, label, secret) in [("keepassxc:Passwords/Internet/GitHub", "alice", "https://github.com", "kp-one,\"quoted\" 8b"),
                                                  ("keepassxc:Passwords/Internet/Mail", "Mail", "https://mail.example.com", "kp-two-\u{e9}"),
                                                  ("keepassxc:Passwords/Wifi", "guest", "", "kp-three-31")] {
            #expect(items.contains { $0.contains("\"service\":\"\(service)\",\"account\":\"\(account)\",\"label\":\"\(label.replacingOccurrences(of: "/", with: "/"))\"") },
                    "\(service) in \(items)")
            let got = b.cli(["get", service, account], asUser: user.name)
            #expect(got.status == 0, "\(got.stderr)")
            expectSecret(got.stdoutText, equals: secret)
        }

        // The wrong database password: keepassxc-cli refuses, nothing is imported, exit 1.
        let other = try TestUser()
        let db2 = try Self.keepassDatabase(other, [("", "X", "x", "", nil, "kp-four")])
        let wrong = b.cli(["import", "keepassxc", db2], stdin: Array("not-the-password\n".utf8), asUser: other.name)
        #expect(wrong.status == 1, "\(wrong.stderr)")
        #expect(wrong.stderr.contains("keepassxc-cli could not export"), "\(wrong.stderr)")
        #expect(ImportFiles.items(b, asUser: other.name).isEmpty)
    }
}
