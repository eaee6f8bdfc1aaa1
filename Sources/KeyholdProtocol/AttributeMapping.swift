import KeyholdCore

/// How a Secret Service item's attribute map and Keyhold's (service, account) name meet.
///
/// The vault names an item by (service, account), each sealed in the store and found through
/// a keyed blind index. The map is folded into that name, reversibly:
/// - `{service: S, account: A}` (what `keyhold put S A` shows) is exactly (S, A);
/// - any other map is (`service` or "secret-service", "ss:" + the remaining pairs, sorted,
///   each `key=value` with `%`, `&` and `=` percent-escaped, joined by `&`).
/// So the same map always names the same item (CreateItem's `replace`), and nothing of it is
/// stored in plaintext. Search by a subset compares maps in the agent, over the caller's own
/// item list from the broker.
public enum AttributeMapping {
    public static let defaultService = "secret-service"
    static let encodedPrefix = "ss:"
    /// As many pairs as a client plausibly sets (libsecret: a handful).
    public static let maxPairs = 64

    public enum MappingError: Error, Equatable {
        case tooManyAttributes
        case tooLarge
    }

    public static func reference(for attributes: [String: String]) throws(MappingError) -> ItemReference {
        guard attributes.count <= maxPairs else { throw .tooManyAttributes }
        var rest = attributes
        var service = defaultService
        if let s = rest["service"], !s.isEmpty {
            service = s
            rest["service"] = nil
        }
        let account: String
        if rest.count == 1, let a = rest["account"], !a.isEmpty, !a.hasPrefix(encodedPrefix) {
            account = a
        } else {
            account = encodedPrefix + rest.sorted { Array($0.key.utf8).lexicographicallyPrecedes(Array($1.key.utf8)) }
                .map { escape($0.key) + "=" + escape($0.value) }.joined(separator: "&")
        }
        guard service.utf8.count <= Limits.maxTextBytes, account.utf8.count <= Limits.maxTextBytes else { throw .tooLarge }
        return ItemReference(service: service, account: account)
    }

    /// The attribute map of a stored item (the inverse of `reference(for:)`).
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

    static func escape(_ s: String) -> String {
        var out = ""
        for u in s.unicodeScalars {
            switch u {
            case "%": out += "%25"
            case "&": out += "%26"
            case "=": out += "%3D"
            default: out.unicodeScalars.append(u)
            }
        }
        return out
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

/// The label a client sets and the content type of its secret, in the item's one sealed label
/// field: "label" for text/plain, else "label" U+001F "content type".
public enum LabelEncoding {
    static let separator: Character = "\u{1F}"
    public static let defaultContentType = "text/plain"

    public static func encode(label: String, contentType: String) -> String {
        let clean = label.filter { $0 != separator }
        return contentType == defaultContentType ? clean : clean + String(separator) + contentType
    }

    public static func decode(_ stored: String) -> (label: String, contentType: String) {
        guard let i = stored.lastIndex(of: separator) else { return (stored, defaultContentType) }
        return (String(stored[..<i]), String(stored[stored.index(after: i)...]))
    }
}
