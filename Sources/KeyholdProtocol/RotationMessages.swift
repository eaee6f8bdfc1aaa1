import KeyholdCore

extension Limits {
    /// The longest a rotation lease may live (its command's time limit), and the longest a
    /// second rotate or a `put --update` waits for one.
    public static let maxRotationSeconds: UInt32 = 600
    /// What a rotation waits when the caller names no timeout.
    public static let defaultRotationSeconds: UInt32 = 60
}

/// Wire fields of the rotate conversation: request fields, `rotationCurrent` (broker → client)
/// and `rotated` (client → broker). Checked here as strictly as every other message.
package enum RotationWire {
    static let secretTag: UInt8 = 1, numberTag: UInt8 = 2

    package static func rotatedFields(_ s: SecureBytes, _ expires: Int64?) -> [Field] {
        var f: [Field] = [.secret(secretTag, s)]
        if let expires { f.append(.number(numberTag, UInt64(bitPattern: expires))) }
        return f
    }

    static func currentFields(_ s: SecureBytes, _ generation: UInt64) -> [Field] {
        [.secret(secretTag, s), .number(numberTag, generation)]
    }

    static func decodeRotated(_ payload: SecureBytes) throws(FrameError) -> (SecureBytes, Int64?) {
        let fs = try FieldSet.payload(payload, allowed: [secretTag, numberTag])
        guard let s = try fs.secret(secretTag, maxBytes: Limits.maxSecretBytes) else { throw .malformed("rotated without a secret") }
        return (s, try fs.number(numberTag).map { Int64(bitPattern: $0) })
    }

    package static func decodeCurrent(_ payload: SecureBytes) throws(FrameError) -> (SecureBytes, UInt64) {
        let fs = try FieldSet.payload(payload, allowed: [secretTag, numberTag])
        guard let s = try fs.secret(secretTag, maxBytes: Limits.maxSecretBytes), let g = try fs.number(numberTag) else {
            throw .malformed("rotation offer without its secret or generation")
        }
        return (s, g)
    }

    /// The request fields rotation added, each only where it means something.
    static func decodeRequestFields(_ fs: FieldSet, into r: inout Request, ifGeneration: UInt8, timeout: UInt8,
                                    expires: UInt8) throws(FrameError) {
        r.ifGeneration = try fs.number(ifGeneration)
        if r.ifGeneration != nil && !(r.operation == .put && r.update) { throw .malformed("--if-generation is for put --update only") }
        if let t = try fs.number(timeout) {
            guard r.operation == .rotate, t >= 1, t <= UInt64(Limits.maxRotationSeconds) else {
                throw .malformed("a timeout of 1 to \(Limits.maxRotationSeconds) s is for rotate only")
            }
            r.timeoutSeconds = UInt32(t)
        }
        r.expires = try fs.number(expires).map { Int64(bitPattern: $0) }
        if r.expires != nil && r.operation != .put { throw .malformed("an expiry is for put only") }
        if r.operation == .rotate && (r.secret != nil || r.appPassword != nil || r.update || r.policy != nil) {
            throw .malformed("rotate carries no secret, password or policy")
        }
    }
}
