import CSodium

/// Bytes that may be secret: held in `sodium_malloc` memory (guard pages, mlock where the
/// limit allows), wiped and freed on deinit.
/// Never printed: `description` hides the bytes.
public final class SecureBytes: @unchecked Sendable, CustomStringConvertible {
    public let count: Int
    private let pointer: UnsafeMutableRawPointer

    /// Zeroed guarded memory of `count` bytes (a 0-byte buffer still gets a valid pointer).
    public init(count: Int) {
        Sodium.ready()
        precondition(count >= 0)
        // sodium_malloc places the bytes against the guard page that follows them.
        guard let p = sodium_malloc(max(count, 1)) else { fatalError("sodium_malloc failed") }
        self.pointer = p
        sodium_memzero(pointer, max(count, 1))
        self.count = count
    }

    /// Copies `bytes` into guarded memory. The caller should wipe its own copy.
    public convenience init<C: Collection>(copying bytes: C) where C.Element == UInt8 {
        self.init(count: bytes.count)
        var i = 0
        for b in bytes { pointer.storeBytes(of: b, toByteOffset: i, as: UInt8.self); i += 1 }
    }

    public convenience init(copying raw: UnsafeRawBufferPointer) {
        self.init(count: raw.count)
        if let base = raw.baseAddress, raw.count > 0 { pointer.copyMemory(from: base, byteCount: raw.count) }
    }

    /// Random bytes from libsodium's CSPRNG.
    public static func random(count: Int) -> SecureBytes {
        let s = SecureBytes(count: count)
        randombytes_buf(s.pointer, count)
        return s
    }

    deinit {
        sodium_free(pointer)  // zeroes before freeing
    }

    public func withUnsafeBytes<R, E: Error>(_ body: (UnsafeRawBufferPointer) throws(E) -> R) throws(E) -> R {
        try body(UnsafeRawBufferPointer(start: pointer, count: count))
    }

    public func withUnsafeMutableBytes<R, E: Error>(_ body: (UnsafeMutableRawBufferPointer) throws(E) -> R) throws(E) -> R {
        try body(UnsafeMutableRawBufferPointer(start: pointer, count: count))
    }

    /// Constant-time comparison.
    public func constantTimeEquals(_ other: SecureBytes) -> Bool {
        count == other.count && sodium_memcmp(pointer, other.pointer, count) == 0
    }

    /// Wipes the bytes now (deinit wipes again).
    public func wipe() { sodium_memzero(pointer, max(count, 1)) }

    public var description: String { "SecureBytes(\(count) bytes)" }
}
