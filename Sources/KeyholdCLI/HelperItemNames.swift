/// The item names git-credential-keyhold and docker-credential-keyhold give their credentials
/// (README: "Credential helpers"). Here, not in KeyholdCredentialHelpers, because `keyhold import`
/// makes the same items and that target depends on this one: `CredentialMapping` calls these.
public enum HelperItemNames {
    public static let gitPrefix = "git:"
    public static let dockerPrefix = "docker:"
    public static let gitLabel = "git credential"

    public static func gitService(protocolName: String, host: String, path: String?) -> String {
        var s = "\(gitPrefix)\(protocolName)://\(host)"
        if let path, !path.isEmpty { s += "/" + path }
        return s
    }

    /// docker's registry key: scheme and path dropped, host lower-cased, as docker's
    /// `ConvertToHostname`. Nil when no host is left.
    public static func dockerHost(_ serverURL: String) -> String? {
        var s = Substring(serverURL.drop { $0.isWhitespace }.reversed().drop { $0.isWhitespace }.reversed())
        for scheme in ["https://", "http://"] where s.lowercased().hasPrefix(scheme) {
            s = s.dropFirst(scheme.count)
            break
        }
        let host = s.split(separator: "/", maxSplits: 1, omittingEmptySubsequences: false).first ?? ""
        guard !host.isEmpty, !host.contains(where: { $0.isWhitespace }) else { return nil }
        return host.lowercased()
    }

    public static func dockerService(host: String) -> String { dockerPrefix + host }
}
