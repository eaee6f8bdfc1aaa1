/// The item names git-credential-keyhold and docker-credential-keyhold give their credentials.
///
/// A copy, on purpose kept to these few lines, of `CredentialMapping.gitService`, `gitLabel`,
/// `dockerHost` and `dockerService` in KeyholdCredentialHelpers: that target depends on this one,
/// so this one cannot call it. They belong here (public), with CredentialMapping calling them.
/// `ImportCredentialHelperTests` stores through the real helpers and imports the same credentials,
/// so a change to either side that makes them differ fails there.
enum HelperItemNames {
    static let gitLabel = "git credential"

    static func gitService(protocolName: String, host: String, path: String?) -> String {
        var s = "git:\(protocolName)://\(host)"
        if let path, !path.isEmpty { s += "/" + path }
        return s
    }

    /// docker's registry key: scheme and path dropped, host lower-cased. Nil when no host is left.
    static func dockerHost(_ serverURL: String) -> String? {
        var s = Substring(serverURL.drop { $0.isWhitespace }.reversed().drop { $0.isWhitespace }.reversed())
        for scheme in ["https://", "http://"] where s.lowercased().hasPrefix(scheme) {
            s = s.dropFirst(scheme.count)
            break
        }
        let host = s.split(separator: "/", maxSplits: 1, omittingEmptySubsequences: false).first ?? ""
        guard !host.isEmpty, !host.contains(where: { $0.isWhitespace }) else { return nil }
        return host.lowercased()
    }

    static func dockerService(host: String) -> String { "docker:" + host }
}
