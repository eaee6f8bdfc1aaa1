/// The attribute map of a stored item, from its (service, account) name: the inverse of
/// `AttributeMapping.reference(for:)` (KeyholdProtocol). Here, in the model every process
/// shares, because the vault computes its search index from it and the agent, `keyhold ls`
/// and the broker's exact match must all read a name the same way.
public enum AttributeMap {
    public static let defaultService = "secret-service"
    public static let encodedPrefix = "ss:"

    /// `{service: S, account: A}` for a plain name; the decoded pairs for an `ss:` account.
    public static func attributes(service: String, account: String) -> [String: String] {
        guard account.hasPrefix(encodedPrefix) else { return ["service": service, "account": account] }
        var map: [String: String] = [:]
        let body = account.dropFirst(encodedPrefix.count)
        if !body.isEmpty {
            for pair in body.split(separator: "&", omittingEmptySubsequences: false) {
                let kv = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
                guard kv.count == 2, let k = unescape(kv[0]), let v = unescape(kv[1]) else {
                    // Not ours after all (a CLI account that starts with "ss:"): plain names.
                    return ["service": service, "account": account]
                }
                map[k] = v
            }
        }
        if service != defaultService { map["service"] = service }
        return map
    }

    /// Whether `attributes` holds every pair of `query` (the Secret Service search rule).
    public static func matches(_ attributes: [String: String], _ query: [String: String]) -> Bool {
        query.allSatisfy { attributes[$0.key] == $0.value }
    }

    static func unescape(_ s: Substring) -> String? {
        var out = ""
        var i = s.startIndex
        while i < s.endIndex {
            let c = s[i]
            if c == "%" {
                let code = s[i...].prefix(3)
                switch code {
                case "%25": out += "%"
                case "%26": out += "&"
                case "%3D": out += "="
                default: return nil
                }
                i = s.index(i, offsetBy: 3)
            } else {
                if c == "&" || c == "=" { return nil }
                out.append(c)
                i = s.index(after: i)
            }
        }
        return out
    }
}
