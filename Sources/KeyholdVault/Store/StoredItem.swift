import KeyholdCore

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
    /// When the secret expires (µs since the epoch), if it was given one; authenticated.
    public var expires: Int64? = nil

    var associatedData: AssociatedData {
        AssociatedData(itemID: id, owner: owner, service: service, account: account, kind: kind,
                       access: access, biometryState: biometryState, passwordHashing: passwordHashing,
                       generation: generation, expires: expires)
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
