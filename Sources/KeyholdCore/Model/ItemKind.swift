/// What an item holds. Part of the item's associated data.
public enum ItemKind: UInt8, Sendable, CaseIterable {
    case generic = 0
    case password = 1
    case refreshToken = 2

    public var name: String {
        switch self {
        case .generic: "generic"
        case .password: "password"
        case .refreshToken: "refresh-token"
        }
    }

    public init?(name: String) {
        guard let kind = ItemKind.allCases.first(where: { $0.name == name }) else { return nil }
        self = kind
    }
}

/// Hard limits, shared by client, protocol and store so each rejects the same input.
public enum Limits {
    /// Largest secret a vault item holds.
    public static let maxSecretBytes = 64 * 1024
    /// Largest service, account, label, reason or executable path.
    public static let maxTextBytes = 4096
    /// Longest reuse window, like `touchIDAuthenticationAllowableReuseDuration` (seconds).
    public static let maxReuseSeconds: UInt32 = 300
    /// Longest prompt answer or application password.
    public static let maxAnswerBytes = 4096
    /// Most allowed executables per item.
    public static let maxAllowedExecutables = 16
}
