/// Everything that decides who may read an item. All of it is bound into the item's
/// associated data, so editing any of it on disk makes the item fail to open.
public struct AccessControl: Sendable, Equatable {
    public var policy: Policy
    /// Executable paths allowed to read the item (like a keychain access group); empty = any
    /// program of the owner.
    public var allowedExecutables: [String]
    /// Seconds after a successful authentication in the same login session during which the
    /// item is released without a prompt; 0 ... `Limits.maxReuseSeconds`.
    public var reuseSeconds: UInt32

    public init(policy: Policy = .none, allowedExecutables: [String] = [], reuseSeconds: UInt32 = 0) {
        self.policy = policy
        self.allowedExecutables = allowedExecutables
        self.reuseSeconds = reuseSeconds
    }
}
