import CSodium
import KeyholdCore

/// The recovery key (issue 39 item 1): 256 random bits shown once to the administrator, which
/// wraps the vault key so a backup can be opened on another machine. It has full entropy, so
/// its subkeys come from `crypto_kdf_derive_from_key` (BLAKE2b), with no password hashing.
///
/// Written form: the 32 key bytes and a 3-byte checksum in RFC 4648 base32, 56 characters in
/// 14 groups of 4 (`ABCD-EFGH-…`). The checksum tells a mistyped key from a wrong one (1 in
/// 16 million passes by chance); case, spaces and dashes are ignored when it is read back.
public struct RecoveryKey: Sendable {
    static let byteCount = 32
    static let checksumCount = 3
    let keyBytes: SymmetricKeyBytes

    public static func generate() -> RecoveryKey { RecoveryKey(keyBytes: .random()) }

    private init(keyBytes: SymmetricKeyBytes) { self.keyBytes = keyBytes }

    /// Subkey ids. Stable forever.
    private enum Purpose: UInt64 { case wrap = 1, identity = 2 }
    private static let context: [CChar] = Array("khrecovr".utf8CString.dropLast())

    private func derive(_ purpose: Purpose) -> SymmetricKeyBytes {
        Sodium.ready()
        let sub = SecureBytes(count: SymmetricKeyBytes.byteCount)
        let rc = sub.withUnsafeMutableBytes { out in
            keyBytes.bytes.withUnsafeBytes { master in
                Self.context.withUnsafeBufferPointer { ctx in
                    crypto_kdf_derive_from_key(out.baseAddress!.assumingMemoryBound(to: UInt8.self), out.count, purpose.rawValue,
                                               ctx.baseAddress!, master.baseAddress!.assumingMemoryBound(to: UInt8.self))
                }
            }
        }
        precondition(rc == 0, "crypto_kdf_derive_from_key failed")
        return SymmetricKeyBytes(sub)
    }

    struct WrapKey: SealingKey { let keyBytes: SymmetricKeyBytes }
    var wrapKey: WrapKey { WrapKey(keyBytes: derive(.wrap)) }

    /// A public name of this key (16 bytes, shown as hex): which written-down key a vault or a
    /// backup wants. A hash of a full-entropy key; it tells nothing about the key.
    public var identity: [UInt8] {
        Array(KeyedHash.hash(Array("keyhold recovery identity v1".utf8), key: MACKey(keyBytes: derive(.identity))).prefix(16))
    }

    // MARK: Written form

    private static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567".utf8)

    private static func checksum(_ key: UnsafeRawBufferPointer) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: 32)
        let domain = Array("keyhold recovery checksum v1".utf8)
        _ = domain.withUnsafeBufferPointer { d in
            crypto_generichash(&out, 32, key.baseAddress!.assumingMemoryBound(to: UInt8.self), UInt64(key.count), d.baseAddress, d.count)
        }
        return Array(out.prefix(checksumCount))
    }

    /// The form to write down. Guarded memory: the caller prints it once and lets it go.
    public var writtenForm: SecureBytes {
        let raw = SecureBytes(count: Self.byteCount + Self.checksumCount)
        raw.withUnsafeMutableBytes { out in
            keyBytes.bytes.withUnsafeBytes { k in
                out.copyMemory(from: k)
                let sum = Self.checksum(k)
                for i in 0..<Self.checksumCount { out[Self.byteCount + i] = sum[i] }
            }
        }
        let characters = (raw.count * 8) / 5  // 280 bits: 56 characters, no padding
        let text = SecureBytes(count: characters + characters / 4 - 1)
        raw.withUnsafeBytes { r in
            text.withUnsafeMutableBytes { t in
                var at = 0
                for c in 0..<characters {
                    if c > 0 && c % 4 == 0 { t[at] = UInt8(ascii: "-"); at += 1 }
                    var value = 0
                    for bit in 0..<5 {
                        let n = c * 5 + bit
                        value = value << 1 | Int(r[n / 8] >> (7 - n % 8) & 1)
                    }
                    t[at] = Self.alphabet[value]; at += 1
                }
            }
        }
        return text
    }

    /// Reads the written form back; nil when it is not 56 base32 characters with a matching
    /// checksum (mistyped).
    public init?(written: SecureBytes) {
        let raw = SecureBytes(count: Self.byteCount + Self.checksumCount)
        let ok = written.withUnsafeBytes { w in
            raw.withUnsafeMutableBytes { r -> Bool in
                var bits = 0
                for byte in w {
                    if byte == UInt8(ascii: "-") || byte == UInt8(ascii: " ") || byte == UInt8(ascii: "\t") { continue }
                    var upper = byte
                    if upper >= UInt8(ascii: "a") && upper <= UInt8(ascii: "z") { upper -= 32 }
                    guard let value = Self.alphabet.firstIndex(of: upper), bits + 5 <= r.count * 8 else { return false }
                    for bit in 0..<5 where value >> (4 - bit) & 1 == 1 {
                        let n = bits + bit
                        r[n / 8] |= 1 << (7 - n % 8)
                    }
                    bits += 5
                }
                guard bits == r.count * 8 else { return false }
                let sum = Self.checksum(UnsafeRawBufferPointer(rebasing: r[0..<Self.byteCount]))
                return sodium_memcmp(sum, r.baseAddress! + Self.byteCount, Self.checksumCount) == 0
            }
        }
        guard ok else { return nil }
        let key = SecureBytes(count: Self.byteCount)
        key.withUnsafeMutableBytes { k in raw.withUnsafeBytes { r in k.copyMemory(from: UnsafeRawBufferPointer(rebasing: r[0..<Self.byteCount])) } }
        self.init(keyBytes: SymmetricKeyBytes(key))
    }

    // MARK: The wrap

    static let wrapDomain = Array("keyhold recovery wrap v1".utf8)

    /// The vault key sealed under this recovery key.
    func wrap(_ vaultKey: VaultKey) -> SealedBox {
        vaultKey.withUnsafeBytes { SealedBox.seal($0, using: wrapKey, authenticating: Self.wrapDomain) }
    }

    /// The vault key out of `box`; `.authenticationFailed` for another key or an altered box.
    func unwrap(_ box: SealedBox) throws(CryptoError) -> VaultKey {
        try VaultKey(bytes: try box.open(using: wrapKey, authenticating: Self.wrapDomain))
    }
}
