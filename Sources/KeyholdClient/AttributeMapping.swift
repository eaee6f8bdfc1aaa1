import KeyholdCore
import KeyholdProtocol

/// How a Secret Service item's attribute map and Keyhold's (service, account) name meet.
///
/// The vault names an item by (service, account), each sealed in the store and found through
/// a keyed blind index. The map is folded into that name, reversibly:
/// - `{service: S, account: A}` (what `keyhold put S A` shows) is exactly (S, A);
/// - any other map is (`service` or "secret-service", "ss:" + the remaining pairs, sorted,
///   each `key=value` with `%`, `&` and `=` percent-escaped, joined by `&`).
/// So the same map always names the same item (CreateItem's `replace`), and nothing of it is
/// stored in plaintext. Search by a subset goes to the broker (`Operation.search`): a keyed
/// tag per pair finds candidates, and the broker matches each candidate's sealed map exactly.
public enum AttributeMapping {
    public static let defaultService = AttributeMap.defaultService
    static let encodedPrefix = AttributeMap.encodedPrefix
    /// As many pairs as a client plausibly sets (libsecret: a handful).
    public static let maxPairs = Limits.maxAttributePairs

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
        AttributeMap.attributes(service: service, account: account)
    }

    /// Whether `attributes` holds every pair of `query` (the Secret Service search rule).
    public static func matches(_ attributes: [String: String], _ query: [String: String]) -> Bool {
        AttributeMap.matches(attributes, query)
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
