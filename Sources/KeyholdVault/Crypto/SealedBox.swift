import CSodium
import KeyholdCore

/// A 192-bit XChaCha20 nonce. Random per box: at 2^-96 collision odds per pair, no counter
/// state needs to survive restarts.
public struct Nonce: Sendable, Equatable {
    public static let byteCount = Int(crypto_aead_xchacha20poly1305_ietf_NPUBBYTES)
    public let bytes: [UInt8]

    public static func random() -> Nonce {
        Sodium.ready()
        var b = [UInt8](repeating: 0, count: byteCount)
        randombytes_buf(&b, byteCount)
        return Nonce(unchecked: b)
    }

    public init(bytes: [UInt8]) throws(CryptoError) {
        guard bytes.count == Self.byteCount else { throw .malformed }
        self.bytes = bytes
    }

    fileprivate init(unchecked: [UInt8]) { self.bytes = unchecked }
}

/// An XChaCha20-Poly1305-IETF box, stored as nonce ‖ ciphertext ‖ tag.
public struct SealedBox: Sendable, Equatable {
    public static let tagByteCount = Int(crypto_aead_xchacha20poly1305_ietf_ABYTES)
    public static let overhead = Nonce.byteCount + tagByteCount

    /// nonce ‖ ciphertext ‖ tag.
    public let combined: [UInt8]

    public init(combined: [UInt8]) throws(CryptoError) {
        guard combined.count >= Self.overhead else { throw .malformed }
        self.combined = combined
    }

    public var nonce: Nonce { try! Nonce(bytes: Array(combined[0..<Nonce.byteCount])) }

    /// Seals `plaintext` under `key`, binding `associatedData`.
    public static func seal(_ plaintext: UnsafeRawBufferPointer, using key: some SealingKey,
                            authenticating associatedData: [UInt8], nonce: Nonce = .random()) -> SealedBox {
        Sodium.ready()
        var out = [UInt8](repeating: 0, count: plaintext.count + overhead)
        out.replaceSubrange(0..<Nonce.byteCount, with: nonce.bytes)
        var clen: UInt64 = 0
        let rc = out.withUnsafeMutableBufferPointer { o in
            associatedData.withUnsafeBufferPointer { ad in
                key.keyBytes.bytes.withUnsafeBytes { k in
                    crypto_aead_xchacha20poly1305_ietf_encrypt(
                        o.baseAddress! + Nonce.byteCount, &clen,
                        plaintext.baseAddress?.assumingMemoryBound(to: UInt8.self), UInt64(plaintext.count),
                        ad.baseAddress, UInt64(ad.count), nil, o.baseAddress!,
                        k.baseAddress!.assumingMemoryBound(to: UInt8.self))
                }
            }
        }
        precondition(rc == 0 && Int(clen) == plaintext.count + tagByteCount)
        return SealedBox(unchecked: out)
    }

    public static func seal(_ plaintext: SecureBytes, using key: some SealingKey, authenticating associatedData: [UInt8]) -> SealedBox {
        plaintext.withUnsafeBytes { seal($0, using: key, authenticating: associatedData) }
    }

    public static func seal(_ plaintext: [UInt8], using key: some SealingKey, authenticating associatedData: [UInt8]) -> SealedBox {
        plaintext.withUnsafeBytes { seal($0, using: key, authenticating: associatedData) }
    }

    /// Opens the box into guarded memory; `.authenticationFailed` for any wrong key, wrong
    /// associated data or altered byte.
    public func open(using key: some SealingKey, authenticating associatedData: [UInt8]) throws(CryptoError) -> SecureBytes {
        let plain = SecureBytes(count: combined.count - Self.overhead)
        let rc = plain.withUnsafeMutableBytes { decrypt(into: $0.baseAddress?.assumingMemoryBound(to: UInt8.self), key, associatedData) }
        guard rc == 0 else { throw .authenticationFailed }
        return plain
    }

    /// Opens a box whose content is not secret (item names, audit details) into an ordinary
    /// array. Guarded memory costs several system calls per allocation, which a listing of
    /// 100,000 items cannot afford; secrets and keys always go through `open`.
    func openAttributes(using key: some SealingKey, authenticating associatedData: [UInt8]) throws(CryptoError) -> [UInt8] {
        var plain = [UInt8](repeating: 0, count: combined.count - Self.overhead)
        let rc = plain.withUnsafeMutableBufferPointer { decrypt(into: $0.baseAddress, key, associatedData) }
        guard rc == 0 else { throw .authenticationFailed }
        return plain
    }

    /// XChaCha20-Poly1305 open of `combined` (nonce ‖ ciphertext ‖ tag) into `plain`, which
    /// holds `combined.count - overhead` bytes. libsodium's result: 0 when authentic.
    private func decrypt(into plain: UnsafeMutablePointer<UInt8>?, _ key: some SealingKey, _ associatedData: [UInt8]) -> Int32 {
        Sodium.ready()
        var mlen: UInt64 = 0
        return combined.withUnsafeBufferPointer { c in
            associatedData.withUnsafeBufferPointer { ad in
                key.keyBytes.bytes.withUnsafeBytes { k in
                    crypto_aead_xchacha20poly1305_ietf_decrypt(
                        plain, &mlen, nil,
                        c.baseAddress! + Nonce.byteCount, UInt64(c.count - Nonce.byteCount),
                        ad.baseAddress, UInt64(ad.count), c.baseAddress!,
                        k.baseAddress!.assumingMemoryBound(to: UInt8.self))
                }
            }
        }
    }

    private init(unchecked: [UInt8]) { self.combined = unchecked }
}
