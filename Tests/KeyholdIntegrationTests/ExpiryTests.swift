import Foundation
import Glibc
import Testing
import KeyholdCore
import KeyholdVault
import KeyholdTestSupport

/// Issue 10, item 4: an item's expiry, through the real broker and CLI. The expiry is the
/// item's (one place), authenticated like its policy, and informational: past it the item is
/// still released and `state` says `expired`.
@Suite(.serialized) struct ExpiryTests {
    func json(_ r: CommandResult) -> [String: Any] {
        (try? JSONSerialization.jsonObject(with: Data(r.stdout))) as? [String: Any] ?? [:]
    }

    func listed(_ b: BrokerFixture, _ service: String) -> [String: Any] {
        b.cli(["ls", "--json"]).stdoutText.split(separator: "\n")
            .compactMap { try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] }
            .first { $0["service"] as? String == service } ?? [:]
    }

    static let later = "2031-05-06T07:08:09.000000Z"

    @Test func expiryRoundTripsThroughLsGetAndState() throws {
        let b = try BrokerFixture()
        let put = b.cli(["put", "tok", "me", "--expires", "2031-05-06T07:08:09Z"], stdin: Array("one".utf8))
        #expect(put.status == 0, "\(put.stderr)")
        #expect(listed(b, "tok")["expires"] as? String == Self.later)
        let got = json(b.cli(["get", "tok", "me", "--json"]))
        #expect(got["expires"] as? String == Self.later && got["generation"] as? Int == 1)
        #expect(b.cli(["state", "tok", "me"]).stdoutText == "available\n")
        let state = json(b.cli(["state", "tok", "me", "--json"]))
        #expect(state["state"] as? String == "available" && state["generation"] as? Int == 1 && state["expires"] as? String == Self.later)
        #expect(b.cli(["ls"]).stdoutText.contains(Self.later), "the table shows the expiry")

        // No expiry: null everywhere; `state --json` of a missing item has no generation.
        #expect(b.cli(["put", "plain", "me"], stdin: Array("p".utf8)).status == 0)
        #expect(listed(b, "plain")["expires"] is NSNull)
        #expect(json(b.cli(["get", "plain", "me", "--json"]))["expires"] is NSNull)
        let missing = json(b.cli(["state", "nothing", "me", "--json"]))
        #expect(missing["state"] as? String == "not-found" && missing["generation"] is NSNull)

        // The expiry belongs to the secret: an update without --expires clears it, with one sets it.
        #expect(b.cli(["put", "tok", "me", "--update"], stdin: Array("two".utf8)).status == 0)
        #expect(listed(b, "tok")["expires"] is NSNull)
        #expect(b.cli(["put", "tok", "me", "--update", "--expires", "@1935817689"], stdin: Array("three".utf8)).status == 0)
        #expect(listed(b, "tok")["expires"] as? String == Self.later)
        #expect(json(b.cli(["state", "tok", "me", "--json"]))["generation"] as? Int == 3)

        let bad = b.cli(["put", "bad", "me", "--expires", "tomorrow"], stdin: Array("x".utf8))
        #expect(bad.status == 2 && bad.stderr.contains("--expires"), "\(bad.stderr)")
        #expect(b.cli(["state", "bad", "me"]).stdoutText == "not-found\n")
    }

    @Test func pastExpiryIsExpiredAndStillReadable() throws {
        let b = try BrokerFixture()
        #expect(b.cli(["put", "old", "me", "--expires", "@1000"], stdin: Array("stale".utf8)).status == 0)
        #expect(b.cli(["state", "old", "me"]).stdoutText == "expired\n")
        let got = b.cli(["get", "old", "me"])
        #expect(got.status == 0, "the caller decides what an expired secret is worth")
        expectSecret(got.stdoutText, equals: "stale", "the caller decides what an expired secret is worth")
        #expect(json(b.cli(["get", "old", "me", "--json"]))["expires"] as? String == "1970-01-01T00:16:40.000000Z")
        // A gated item past its expiry is `expired` too (the word does not say whether it prompts).
        #expect(b.cli(["put", "gated", "me", "--policy", "device-passcode", "--expires", "now"], stdin: Array("g".utf8)).status == 0)
        #expect(b.cli(["state", "gated", "me"]).stdoutText == "expired\n")
    }

    @Test func rotateExpiresSetsTheNewSecretsExpiry() throws {
        let b = try BrokerFixture()
        #expect(b.cli(["put", "idp", "me", "--expires", "@1000"], stdin: Array("one".utf8)).status == 0)
        let r = b.cli(["rotate", "idp", "me", "--expires", Self.later, "--", "/bin/sh", "-c", "printf two"])
        #expect(r.status == 0, "\(r.stderr)")
        let got = json(b.cli(["get", "idp", "me", "--json"]))
        #expect(got["expires"] as? String == Self.later && got["generation"] as? Int == 2)
        #expect(b.cli(["state", "idp", "me"]).stdoutText == "available\n")
        // Without --expires the new secret has none (the old expiry described the old secret).
        #expect(b.cli(["rotate", "idp", "me", "--", "/bin/sh", "-c", "printf three"]).status == 0)
        #expect(json(b.cli(["get", "idp", "me", "--json"]))["expires"] is NSNull)
        // A bad TIME is refused before COMMAND runs.
        let marker = b.directory + "/ran"
        let bad = b.cli(["rotate", "idp", "me", "--expires", "soon", "--", "/bin/sh", "-c", "touch \(marker); printf x"])
        #expect(bad.status == 2 && !FileManager.default.fileExists(atPath: marker))
    }

    /// The expiry is bound into the item's associated data: editing the column on disk (to
    /// extend, shorten, clear or add one) makes the item fail with integrity (exit 13), not
    /// report another expiry. Other items still read.
    @Test(arguments: ["extend", "shorten", "clear", "add"])
    func tamperedExpiryFailsIntegrity(_ tamper: String) throws {
        let b = try BrokerFixture()
        #expect(b.cli(["put", "dated", "me", "--expires", "2031-05-06T07:08:09Z"], stdin: Array("d".utf8)).status == 0)
        #expect(b.cli(["put", "undated", "me"], stdin: Array("u".utf8)).status == 0)
        #expect(b.cli(["put", "other", "me"], stdin: Array("o".utf8)).status == 0)
        b.stop()
        do {
            let db = try Database(path: b.stateDirectory + "/vault.db")
            switch tamper {
            case "extend": try db.execute("UPDATE items SET expires_us = expires_us + 86400000000 * 365 WHERE expires_us IS NOT NULL")
            case "shorten": try db.execute("UPDATE items SET expires_us = 1000 WHERE expires_us IS NOT NULL")
            case "clear": try db.execute("UPDATE items SET expires_us = NULL")
            default: try db.execute("UPDATE items SET expires_us = 1000 WHERE expires_us IS NULL")
            }
            db.close()
        }
        try b.start()
        let victim = tamper == "add" ? "undated" : "dated"
        let r = b.cli(["get", victim, "me"])
        #expect(r.status == 13 && r.stdout.isEmpty, "\(tamper): \(r.stderr)")
        #expect(b.cli(["state", victim, "me"]).status == 13)
        #expect(listed(b, victim).isEmpty, "ls leaves the altered row out")
        if tamper != "add" { expectSecret(b.cli(["get", "other", "me"]).stdoutText, equals: "o") }
    }
}
