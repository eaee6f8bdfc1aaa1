import Glibc
import KeyholdClient
import KeyholdCore

/// The one mapping between helper credentials and vault items (README: "Credential helpers").
///
/// - git: service `git:PROTOCOL://HOST[:PORT][/PATH]`, account = username, kind `password`
///   (`refresh-token` when git passed an `oauth_refresh_token`). The secret is the password
///   itself; with a refresh token or an expiry it is `\0keyhold-git\n` followed by
///   `password=`, `password_expiry_utc=` and `oauth_refresh_token=` lines (a password from git
///   never holds a NUL or newline, so the two forms cannot be confused). The expiry is also the
///   label `password_expiry_utc=SECONDS`, which a lookup without a username checks before
///   releasing anything; a lookup by username reads the item directly, without listing the vault.
/// - docker: service `docker:HOST[:PORT]` (lower case, scheme and path dropped, as docker's
///   `ConvertToHostname`), account = Username (`<token>` for identity tokens), kind
///   `password`, label = the ServerURL as stored, which `list` reports.
public enum CredentialMapping {
    public static let gitPrefix = "git:"
    public static let dockerPrefix = "docker:"
    static let gitBlobMagic: [UInt8] = Array("\0keyhold-git\n".utf8)
    static let expiryLabelPrefix = "password_expiry_utc="
    public static let gitLabel = "git credential"

    public static func gitService(protocolName: String, host: String, path: String?) -> String {
        var s = "\(gitPrefix)\(protocolName)://\(host)"
        if let path, !path.isEmpty { s += "/" + path }
        return s
    }

    public static func gitLabel(expiry: Int64?) -> String {
        expiry.map { "\(expiryLabelPrefix)\($0)" } ?? gitLabel
    }

    public static func expiry(fromLabel label: String) -> Int64? {
        guard label.hasPrefix(expiryLabelPrefix) else { return nil }
        return Int64(label.dropFirst(expiryLabelPrefix.count))
    }

    /// The stored secret for a git credential.
    public static func gitSecret(password: SecureBytes, refreshToken: SecureBytes?, expiry: Int64? = nil) -> SecureBytes {
        guard refreshToken != nil || expiry != nil else { return password.withUnsafeBytes { SecureBytes(copying: $0) } }
        let w = SecureWriter()
        w.append(String(decoding: gitBlobMagic, as: UTF8.self) + "password=")
        w.append(password)
        w.append("\n")
        if let expiry { w.append("password_expiry_utc=\(expiry)\n") }
        if let refreshToken {
            w.append("oauth_refresh_token=")
            w.append(refreshToken)
            w.append("\n")
        }
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

    /// docker's registry key: scheme and path dropped, host lower-cased. Nil when no host is left.
    public static func dockerHost(_ serverURL: String) -> String? {
        var s = Substring(serverURL.trimmingWhitespace())
        for scheme in ["https://", "http://"] where s.lowercased().hasPrefix(scheme) {
            s = s.dropFirst(scheme.count)
            break
        }
        let host = s.split(separator: "/", maxSplits: 1, omittingEmptySubsequences: false).first ?? ""
        guard !host.isEmpty, !host.contains(where: { $0.isWhitespace }) else { return nil }
        return host.lowercased()
    }

    public static func dockerService(host: String) -> String { dockerPrefix + host }

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
