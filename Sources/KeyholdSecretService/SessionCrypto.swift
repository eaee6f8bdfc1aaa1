import CKeyholdSS
import KeyholdCore

/// One client session: how secrets cross the bus. `plain` sends them as they are (the bus is
/// the user's own); `dh-ietf1024-sha256-aes128-cbc-pkcs7` encrypts each under an AES key both
/// sides derived from a modp-1024 Diffie-Hellman exchange.
public enum SessionAlgorithm: String, Sendable {
    case plain
    case dh = "dh-ietf1024-sha256-aes128-cbc-pkcs7"
}

public final class SecretSession {
    public let algorithm: SessionAlgorithm
    /// AES-128 key for `dh`; nil for `plain`.
    private let key: SecureBytes?

    private init(algorithm: SessionAlgorithm, key: SecureBytes?) {
        self.algorithm = algorithm
        self.key = key
    }

    deinit { key?.wipe() }

    public static func plain() -> SecretSession { SecretSession(algorithm: .plain, key: nil) }

    /// Answers the client's public key: our public key, and the session. A peer key outside
    /// the group is refused.
    public static func negotiate(peerPublicKey: [UInt8]) throws(BusError) -> (SecretSession, publicKey: [UInt8]) {
        guard !peerPublicKey.isEmpty, peerPublicKey.count <= Int(CKSS_DH_BYTES) else {
            throw .invalidArgs("the public key must be 1 to 128 bytes")
        }
        let priv = SecureBytes(count: Int(CKSS_DH_BYTES))
        defer { priv.wipe() }
        var pub = [UInt8](repeating: 0, count: Int(CKSS_DH_BYTES))
        let key = SecureBytes(count: Int(CKSS_AES_KEY_BYTES))
        let ok = priv.withUnsafeMutableBytes { p -> Bool in
            let privPtr = p.baseAddress!.assumingMemoryBound(to: UInt8.self)
            guard ckss_dh_keypair(privPtr, &pub) == 0 else { return false }
            return key.withUnsafeMutableBytes { k in
                ckss_dh_derive(privPtr, peerPublicKey, peerPublicKey.count, k.baseAddress!.assumingMemoryBound(to: UInt8.self)) == 0
            }
        }
        guard ok else {
            key.wipe()
            throw .invalidArgs("the public key is not in the modp-1024 group")
        }
        return (SecretSession(algorithm: .dh, key: key), pub)
    }

    /// The secret as it goes to the client: (parameters, value).
    public func encode(_ secret: SecureBytes) throws(BusError) -> (parameters: [UInt8], value: [UInt8]) {
        guard let key else { return ([], secret.withUnsafeBytes { Array($0) }) }
        var iv = [UInt8](repeating: 0, count: Int(CKSS_IV_BYTES))
        guard ckss_random(&iv, iv.count) == 0 else { throw .failed("no randomness") }
        var out = [UInt8](repeating: 0, count: secret.count + 16)
        var n = 0
        let rc = key.withUnsafeBytes { k in
            secret.withUnsafeBytes { s in
                ckss_aes_encrypt(k.baseAddress!.assumingMemoryBound(to: UInt8.self), iv,
                                 s.baseAddress?.assumingMemoryBound(to: UInt8.self), s.count, &out, &n)
            }
        }
        guard rc == 0 else { throw .failed("encryption failed") }
        return (iv, Array(out[..<n]))
    }

    /// The secret a client sent, decrypted for `dh`. A wrong IV size or padding is InvalidArgs.
    public func decode(parameters: [UInt8], value: [UInt8]) throws(BusError) -> SecureBytes {
        guard let key else {
            guard parameters.isEmpty else { throw .invalidArgs("a plain session takes no parameters") }
            var copy = value
            defer { ckss_wipe(&copy, copy.count) }
            return SecureBytes(copying: copy)
        }
        guard parameters.count == Int(CKSS_IV_BYTES) else { throw .invalidArgs("the IV must be 16 bytes") }
        guard !value.isEmpty, value.count % 16 == 0 else { throw .invalidArgs("the value is not AES-CBC ciphertext") }
        let out = SecureBytes(count: value.count)
        var n = 0
        let rc = key.withUnsafeBytes { k in
            out.withUnsafeMutableBytes { o in
                ckss_aes_decrypt(k.baseAddress!.assumingMemoryBound(to: UInt8.self), parameters, value, value.count,
                                 o.baseAddress!.assumingMemoryBound(to: UInt8.self), &n)
            }
        }
        guard rc == 0 else {
            out.wipe()
            throw .invalidArgs("the value does not decrypt under this session")
        }
        let secret = out.withUnsafeBytes { SecureBytes(copying: UnsafeRawBufferPointer(rebasing: $0[..<n])) }
        out.wipe()
        return secret
    }
}
