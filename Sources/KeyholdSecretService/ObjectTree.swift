/// The object paths the agent serves. A path is resolved here once; anything else is an
/// unknown object.
public enum SecretObject: Equatable {
    case service
    case collection
    case item(String)
    case session(String)
    case prompt(String)

    public static let servicePath = "/org/freedesktop/secrets"
    public static let collectionPath = "/org/freedesktop/secrets/collection/login"
    public static let defaultAliasPath = "/org/freedesktop/secrets/aliases/default"
    static let sessionPrefix = "/org/freedesktop/secrets/session/"
    static let promptPrefix = "/org/freedesktop/secrets/prompt/"

    public static func resolve(_ path: String) -> SecretObject? {
        switch path {
        case servicePath: return .service
        case collectionPath, defaultAliasPath: return .collection
        default: break
        }
        for prefix in [collectionPath + "/", defaultAliasPath + "/"] where path.hasPrefix(prefix) {
            let id = String(path.dropFirst(prefix.count))
            return isItemID(id) ? .item(id) : nil
        }
        if path.hasPrefix(sessionPrefix) {
            let n = String(path.dropFirst(sessionPrefix.count))
            return isNumber(n) ? .session(path) : nil
        }
        if path.hasPrefix(promptPrefix) {
            let n = String(path.dropFirst(promptPrefix.count))
            return isNumber(n) ? .prompt(path) : nil
        }
        return nil
    }

    public static func itemPath(_ id: String) -> String { collectionPath + "/" + id }

    /// Item ids are the vault's 16-byte ids in lower-case hex.
    static func isItemID(_ s: String) -> Bool {
        s.utf8.count == 32 && s.utf8.allSatisfy { (48...57).contains($0) || (97...102).contains($0) }
    }

    static func isNumber(_ s: String) -> Bool {
        !s.isEmpty && s.utf8.count <= 9 && s.utf8.allSatisfy { (48...57).contains($0) }
    }
}

enum Interface {
    static let service = "org.freedesktop.Secret.Service"
    static let collection = "org.freedesktop.Secret.Collection"
    static let item = "org.freedesktop.Secret.Item"
    static let session = "org.freedesktop.Secret.Session"
    static let prompt = "org.freedesktop.Secret.Prompt"
    static let properties = "org.freedesktop.DBus.Properties"
}
