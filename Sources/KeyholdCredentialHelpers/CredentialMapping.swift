import Glibc
import KeyholdCLI
import KeyholdClient
import KeyholdCore

/// The one mapping between helper credentials and vault items (README: "Credential helpers").
///
/// - git: service `git:PROTOCOL://HOST[:PORT][/PATH]`, account = username, kind `password`
///   (`refresh-token` when git passed an `oauth_refresh_token`). The secret is the password
///   itself; with a refresh token it is `\0keyhold-git\n` followed by `password=` and
///   `oauth_refresh_token=` lines (a password from git never holds a NUL or newline, so the two
///   forms cannot be confused). `password_expiry_utc` is the item's expiry (`keyhold put
///   --expires`: authenticated, shown by `ls` and `state`), which a lookup without a username
///   checks before releasing anything; a lookup by username reads the item directly.
///   Items stored before items had an expiry kept it in the label `password_expiry_utc=SECONDS`
///   and a `password_expiry_utc=` line of the blob: still read, never written.
/// - docker: service `docker:HOST[:PORT]` (lower case, scheme and path dropped, as docker's
///   `ConvertToHostname`), account = Username (`<token>` for identity tokens), kind
///   `password`, label = the ServerURL as stored, which `list` reports.
public enum CredentialMapping {
    public static let gitPrefix = HelperItemNames.gitPrefix
    public static let dockerPrefix = HelperItemNames.dockerPrefix
    static let gitBlobMagic: [UInt8] = Array("\0keyhold-git\n".utf8)
    static let expiryLabelPrefix = "password_expiry_utc="
    public static let gitLabel = HelperItemNames.gitLabel

    public static func gitService(protocolName: String, host: String, path: String?) -> String {
        HelperItemNames.gitService(protocolName: protocolName, host: host, path: path)
    }

    public static func gitLabel(expiry: Int64?) -> String {
        expiry.map { "\(expiryLabelPrefix)\($0)" } ?? gitLabel
    }

    /// An item's expiry in seconds (git's unit): its own, else a legacy label's.
    public static func expiry(of item: ItemInfo) -> Int64? {
        item.expires.map(seconds) ?? expiry(fromLabel: item.label)
    }

    /// µs since the epoch (the vault's unit) to whole seconds, rounded down; and back.
    public static func seconds(_ micros: Int64) -> Int64 { micros >= 0 ? micros / 1_000_000 : (micros - 999_999) / 1_000_000 }
    public static func microseconds(_ seconds: Int64) -> Int64 { seconds.multipliedReportingOverflow(by: 1_000_000).overflow
        ? (seconds < 0 ? Int64.min : Int64.max) : seconds * 1_000_000 }

    public static func expiry(fromLabel label: String) -> Int64? {
        guard label.hasPrefix(expiryLabelPrefix) else { return nil }
        return Int64(label.dropFirst(expiryLabelPrefix.count))
    }

    /// The stored secret for a git credential.
    public static func gitSecret(password: SecureBytes, refreshToken: SecureBytes?) -> SecureBytes {
        guard let refreshToken else { return password.withUnsafeBytes { SecureBytes(copying: $0) } }
        let w = SecureWriter()
        w.append(String(decoding: gitBlobMagic, as: UTF8.self) + "password=")
        w.append(password)
        w.append("\noauth_refresh_token=")
        w.append(refreshToken)
        w.append("\n")
        return w.finish()
    }

    /// Password, refresh token and expiry out of a stored secret. A blob that does not parse is
    /// treated as a plain password (and then refused by `reply` if it cannot be sent).
    public static func gitCredential(fromSecret secret: SecureBytes) -> (password: SecureBytes, refreshToken: SecureBytes?, expiry: Int64?) {
        let isBlob = secret.withUnsafeBytes { $0.starts(with: gitBlobMagic) }
        if isBlob {
            let rest = secret.withUnsafeBytes { SecureBytes(copying: UnsafeRawBufferPointer(rebasing: $0[gitBlobMagic.count...])) }
            defer { rest.wipe() }
            if let c = try? GitCredentialProtocol.parse(rest), let p = c.password {
                let out = (p.withUnsafeBytes { SecureBytes(copying: $0) }, c.oauthRefreshToken.map { t in t.withUnsafeBytes { SecureBytes(copying: $0) } },
                           c.passwordExpiryUTC)
                c.wipe()
                return out
            }
        }
        return (secret.withUnsafeBytes { SecureBytes(copying: $0) }, nil, nil)
    }

    public static func dockerHost(_ serverURL: String) -> String? { HelperItemNames.dockerHost(serverURL) }
    public static func dockerService(host: String) -> String { HelperItemNames.dockerService(host: host) }

    /// Access control for an item being replaced: the existing item's, so a helper's `store`
    /// never weakens a policy someone set with `keyhold put --update`.
    public static func access(of item: ItemInfo) -> AccessControl? {
        guard let policy = try? Policy(parsing: item.policy) else { return nil }
        return AccessControl(policy: policy, allowedExecutables: item.allowedExecutables, reuseSeconds: item.reuseSeconds)
    }

    /// Deletes an item with the interaction a read of it would use: deleting a gated item
    /// needs its policy (as `keyhold rm`, issue 8 item 5).
    public static func delete(_ vault: Vault, service: String, account: String, interaction: Interaction?) throws(KeyholdError) {
        try vault.delete(service: service, account: account, interaction: interaction)
    }

    public static func now() -> Int64 { Int64(time(nil)) }
}

extension String {
    func trimmingWhitespace() -> String {
        let scalars = unicodeScalars
        guard let first = scalars.firstIndex(where: { !$0.properties.isWhitespace }),
              let last = scalars.lastIndex(where: { !$0.properties.isWhitespace }) else { return "" }
        return String(scalars[first...last])
    }
}
