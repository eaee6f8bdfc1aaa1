import Foundation
import Glibc
import Testing
import KeyholdClient
import KeyholdCore
import KeyholdTestSupport

/// Issue 10: `vault.rotate` (the Swift API apps use) driven directly against a real broker;
/// `RotationTests` covers the same path through `keyhold rotate`.
@Suite(.serialized) struct RotationClientTests {
    struct ProviderRefused: Error, CustomStringConvertible {
        var description: String { "the provider answered invalid_grant" }
    }

    func secret(_ s: String) -> SecureBytes { SecureBytes(copying: Array(s.utf8)) }
    func text(_ s: SecureBytes) -> String { s.withUnsafeBytes { String(decoding: $0, as: UTF8.self) } }

    /// A broker with one refresh token "rt-1" at generation 1, and a vault talking to it.
    func seeded() throws -> (BrokerFixture, Vault) {
        let b = try BrokerFixture()
        let vault = Vault(socketPath: b.socketPath)
        try vault.add(secret("rt-1"), service: "idp", account: "me", kind: .refreshToken)
        return (b, vault)
    }

    /// The stored secret and its generation. Its own release is audited: read the audit first.
    func stored(_ vault: Vault) throws -> (secret: String, generation: UInt64) {
        let r = try vault.release(service: "idp", account: "me")
        defer { r.secret.wipe() }
        return (text(r.secret), r.generation)
    }

    /// The item's audit entries as "operation decision outcome" (the put first).
    func audit(_ b: BrokerFixture) -> [String] {
        b.cli(["audit", "--json", "--item", "idp/me"]).stdoutText.split(separator: "\n").compactMap { line in
            guard let e = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any] else { return nil }
            return "\(e["operation"] ?? "?") \(e["decision"] ?? "?") \(e["outcome"] ?? "?")"
        }
    }

    @Test func newSecretIsStoredAtTheNextGenerationWithOneReleaseAndOneUpdate() throws {
        let (b, vault) = try seeded()
        var offered: [String] = []
        let r = try vault.rotate(service: "idp", account: "me", reason: "refresh") { current in
            offered.append(text(current))
            return secret("rt-2")
        }
        defer { r.secret.wipe() }
        #expect(offered.count == 1, "the body ran once")
        expectSecret(offered.first, equals: "rt-1", "the body was given the current secret")
        #expect(r.rotatedHere && r.generation == 2)
        expectSecret(text(r.secret), equals: "rt-2")
        #expect(audit(b) == ["put granted ok", "get granted ok", "update granted ok"])
        let now = try stored(vault)
        expectSecret(now.secret, equals: "rt-2")
        #expect(now.generation == 2)
    }

    @Test func throwingBodyChangesNothingSurfacesItsErrorAndFreesTheLease() throws {
        let (b, vault) = try seeded()
        do throws(KeyholdError) {
            _ = try vault.rotate(service: "idp", account: "me") { _ in throw ProviderRefused() }
            Issue.record("rotate returned although its body threw")
        } catch {
            #expect(error.description.contains("invalid_grant"), "\(error)")
        }
        // A KeyholdError thrown by the body reaches the caller as it is.
        do throws(KeyholdError) {
            _ = try vault.rotate(service: "idp", account: "me") { _ in throw KeyholdError.conflict() }
            Issue.record("rotate returned although its body threw")
        } catch {
            #expect(error == .conflict())
        }
        #expect(!audit(b).contains("update granted ok"))
        let unchanged = try stored(vault)
        expectSecret(unchanged.secret, equals: "rt-1")
        #expect(unchanged.generation == 1)
        // The lease went with the failed rotations: the next one takes it at once (a lease
        // left behind would be waited for until this timeout and answer conflict).
        let next = try vault.rotate(service: "idp", account: "me", timeout: 10) { _ in secret("rt-2") }
        defer { next.secret.wipe() }
        #expect(next.rotatedHere && next.generation == 2)
        let rotated = try stored(vault)
        expectSecret(rotated.secret, equals: "rt-2")
        #expect(rotated.generation == 2)
    }

    @Test func bodyReturningMoreThanTheCapIsRefusedAndChangesNothing() throws {
        let (b, vault) = try seeded()
        do throws(KeyholdError) {
            _ = try vault.rotate(service: "idp", account: "me") { _ in SecureBytes(count: Limits.maxSecretBytes + 1) }
            Issue.record("rotate stored a secret over the cap")
        } catch {
            #expect(error.outcome == .usage && error.description.contains("\(Limits.maxSecretBytes)-byte limit"), "\(error)")
        }
        #expect(!audit(b).contains("update granted ok"))
        let unchanged = try stored(vault)
        expectSecret(unchanged.secret, equals: "rt-1")
        #expect(unchanged.generation == 1)
        // Exactly the cap is a secret like any other.
        let full = try vault.rotate(service: "idp", account: "me") { _ in SecureBytes(count: Limits.maxSecretBytes) }
        full.secret.wipe()
        #expect(full.generation == 2)
        let r = try vault.release(service: "idp", account: "me")
        defer { r.secret.wipe() }
        #expect(r.secret.count == Limits.maxSecretBytes && r.generation == 2)
    }

    /// A provider that says the token is still good: the body hands back the buffer it was
    /// given. Before the fix that buffer was wiped before it was sent, and zeros were stored.
    @Test func bodyReturningTheCurrentSecretStoresItUnchanged() throws {
        let (b, vault) = try seeded()
        let r = try vault.rotate(service: "idp", account: "me") { current in current }
        defer { r.secret.wipe() }
        #expect(r.generation == 2)
        expectSecret(text(r.secret), equals: "rt-1")
        #expect(audit(b).last == "update granted ok")
        let now = try stored(vault)
        expectSecret(now.secret, equals: "rt-1")
        #expect(now.generation == 2)
    }
}
