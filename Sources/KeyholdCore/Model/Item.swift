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

/// An item as stored, with everything but its secret. Only `VaultStore` creates these, after
/// its boxes' attributes opened and matched.
public struct StoredItem: Sendable, Equatable {
    public let id: ItemID
    public let owner: UInt32
    public let service: String
    public let account: String
    public let label: String
    public let kind: ItemKind
    public let access: AccessControl
    public let biometryState: [UInt8]?
    /// Microseconds since the Unix epoch (UTC).
    public let createdAt: Int64
    public let updatedAt: Int64
    /// Argon2id parameters when the policy includes `+app-password`.
    public let passwordHashing: PasswordHashParameters?
    /// Grows on every change of the secret or policy (1 when added; 0 for an item stored
    /// before generations existed). A change based on an older read is `.conflict`.
    public let generation: UInt64

    var associatedData: AssociatedData {
        AssociatedData(itemID: id, owner: owner, service: service, account: account, kind: kind,
                       access: access, biometryState: biometryState, passwordHashing: passwordHashing,
                       generation: generation)
    }
}

/// Consecutive authentication failures of one uid and the lockout they caused. Persisted so
/// a broker restart does not reset it.
public struct LockoutRecord: Sendable, Equatable {
    public var uid: UInt32
    public var failures: UInt32
    /// How many lockouts in a row (drives the escalating delay).
    public var level: UInt32
    /// Microseconds since the epoch until which the uid is locked out; 0 = not locked.
    public var lockedUntil: Int64

    public init(uid: UInt32, failures: UInt32 = 0, level: UInt32 = 0, lockedUntil: Int64 = 0) {
        self.uid = uid
        self.failures = failures
        self.level = level
        self.lockedUntil = lockedUntil
    }
}
