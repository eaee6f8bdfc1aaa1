import KeyholdCore

/// The lookup key of an item: keyed BLAKE2b of a canonical encoding of (owner uid, service,
/// account). Lets the store find an item without storing its names in plaintext; without
/// the vault key nobody can test a guess.
public struct BlindIndex: Sendable, Hashable {
    public static let byteCount = KeyedHash.byteCount
    public let bytes: [UInt8]

    public init(key: BlindIndexKey, owner: UInt32, service: String, account: String) {
        var e = CanonicalEncoder(domain: "keyhold blind index v1")
        e.append(owner)
        e.append(service)
        e.append(account)
        self.bytes = KeyedHash.hash(e.bytes, key: key)
    }

    init(stored: [UInt8]) { self.bytes = stored }
}
