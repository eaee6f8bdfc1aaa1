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

    /// Parses 32 hex digits.
    public init?(hex: String) {
        let digits = Array(hex.utf8)
        guard digits.count == Self.byteCount * 2 else { return nil }
        var out: [UInt8] = []
        out.reserveCapacity(Self.byteCount)
        func nibble(_ c: UInt8) -> UInt8? {
            switch c {
            case 48...57: c - 48
            case 97...102: c - 87
            case 65...70: c - 55
            default: nil
            }
        }
        var i = 0
        while i < digits.count {
            guard let hi = nibble(digits[i]), let lo = nibble(digits[i + 1]) else { return nil }
            out.append(hi << 4 | lo)
            i += 2
        }
        self.bytes = out
    }

    private init(unchecked: [UInt8]) { self.bytes = unchecked }

    public var description: String {
        let hex: [UInt8] = Array("0123456789abcdef".utf8)
        var s: [UInt8] = []
        s.reserveCapacity(32)
        for b in bytes { s.append(hex[Int(b >> 4)]); s.append(hex[Int(b & 15)]) }
        return String(decoding: s, as: UTF8.self)
    }
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

    public init(service: String, account: String, label: String = "", kind: ItemKind = .generic,
                access: AccessControl = AccessControl(), biometryState: [UInt8]? = nil) {
        self.service = service
        self.account = account
        self.label = label
        self.kind = kind
        self.access = access
        self.biometryState = biometryState
    }
}
