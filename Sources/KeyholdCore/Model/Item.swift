import CSodium

/// A stable item id: 16 random bytes, shown as hex. Never derived from names.
public struct ItemID: Sendable, Hashable, CustomStringConvertible {
    public static let byteCount = 16
    public let bytes: [UInt8]

    public static func random() -> ItemID {
        Sodium.ready()
        var b = [UInt8](repeating: 0, count: byteCount)
        randombytes_buf(&b, byteCount)
        return ItemID(unchecked: b)
    }

    public init?(bytes: [UInt8]) {
        guard bytes.count == Self.byteCount else { return nil }
        self.bytes = bytes
    }

    /// Parses 32 hex digits (either case: ids are typed by people).
    public init?(hex: String) {
        guard hex.utf8.count == Self.byteCount * 2, let bytes = Hex.decode(hex, allowingUppercase: true) else { return nil }
        self.bytes = bytes
    }

    private init(unchecked: [UInt8]) { self.bytes = unchecked }

    public var description: String { Hex.encode(bytes) }
}

/// What a caller asks the store to keep (the secret travels separately, in guarded memory).
public struct NewItem: Sendable, Equatable {
    public var service: String
    public var account: String
    public var label: String
    public var kind: ItemKind
    public var access: AccessControl
    /// Digest of the enrolled fingerprint set (32 bytes), set by the broker for
    /// `biometry-current-set` items; bound into the item's associated data.
    public var biometryState: [UInt8]?
    /// When the secret expires (µs since the epoch); bound into the associated data.
    public var expires: Int64?

    public init(service: String, account: String, label: String = "", kind: ItemKind = .generic,
                access: AccessControl = AccessControl(), biometryState: [UInt8]? = nil, expires: Int64? = nil) {
        self.expires = expires
        self.service = service
        self.account = account
        self.label = label
        self.kind = kind
        self.access = access
        self.biometryState = biometryState
    }
}
