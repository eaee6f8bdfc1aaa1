import KeyholdCore

/// Everything an item's boxes are bound to. Editing any of these on disk (a policy set to
/// `none`, a row moved to another owner, a key swapped between items) makes every box of the
/// item fail to open, so the store reports an integrity failure instead of a secret.
public struct AssociatedData: Sendable, Equatable {
    /// Bumped when the encoding or the set of fields changes. 2 adds the generation; a row of
    /// generation 0 was sealed before generations existed and keeps the version 1 encoding.
    public static let formatVersion: UInt32 = 2

    public var itemID: ItemID
    public var owner: UInt32
    public var service: String
    public var account: String
    public var kind: ItemKind
    public var access: AccessControl
    public var biometryState: [UInt8]?
    public var passwordHashing: PasswordHashParameters?
    /// Grows on every change of the item's secret or policy; an older row of the same item
    /// carries an older generation, which the store refuses.
    public var generation: UInt64 = 0
    /// When the secret expires (µs since the epoch). Appended only when set, so rows sealed
    /// before expiries existed keep their encoding; setting, clearing or moving it on disk
    /// changes the bytes and every box fails.
    public var expires: Int64? = nil

    /// Which box of an item the bytes authenticate. Part of the encoding, so a box cannot be
    /// moved into another slot of the same item.
    public enum Role: UInt8, Sendable {
        /// The (service, account, label) box. Its AD cannot contain the names it holds, so it
        /// leaves them out; the store checks the opened names against the blind index.
        case attributes = 1
        /// The item key sealed under the wrapping key.
        case wrappedKey = 2
        /// The item key sealed under the app-password key (inside the wrapped key).
        case passwordWrappedKey = 3
        /// The secret sealed under the item key.
        case secret = 4
    }

    public func encoded(for role: Role) -> [UInt8] { encoded(for: role, policyText: access.policy.description) }

    /// `policyText` must be `access.policy.description`; the store passes the stored text it
    /// already checked is canonical, which saves re-printing the policy for every row it lists.
    func encoded(for role: Role, policyText: String) -> [UInt8] {
        var e = CanonicalEncoder(domain: "keyhold item v1")
        if generation == 0 {
            e.append(UInt32(1))
        } else {
            e.append(Self.formatVersion)
            e.append(generation)
        }
        e.append(role.rawValue)
        e.append(bytes: itemID.bytes)
        e.append(owner)
        if role != .attributes {
            e.append(service)
            e.append(account)
        }
        e.append(kind.rawValue)
        e.append(policyText)
        e.append(UInt32(access.allowedExecutables.count))
        for path in access.allowedExecutables { e.append(path) }
        e.append(access.reuseSeconds)
        e.append(optionalBytes: biometryState)
        e.append(optionalBytes: passwordHashing?.encoded)
        if let expires {
            e.append("expires")
            e.append(UInt64(bitPattern: expires))
        }
        return e.bytes
    }
}
