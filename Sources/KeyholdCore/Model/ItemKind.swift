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
