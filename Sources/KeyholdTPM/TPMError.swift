import CTSS2

/// Every way a TPM operation can fail. Closed; carries response codes only (never data).
public enum TPMError: Error, Equatable, Sendable, CustomStringConvertible {
    /// No TPM answers at the configured TCTI (no device, resource manager or simulator, or it
    /// went away mid-command).
    case unavailable(code: UInt32)
    /// The TPM refused the sealed object: it was sealed by another TPM, or this TPM was cleared
    /// since (its storage seed changed), or the blob was altered.
    case sealedElsewhere(code: UInt32)
    /// The PCR values no longer match the ones the key was sealed to (a firmware, boot loader
    /// or kernel change): the key must be re-sealed from the file protector.
    case pcrMismatch(code: UInt32)
    /// The sealed-key file is not a Keyhold TPM blob (wrong magic, version, sizes, PCR list).
    case blobMalformed
    /// A TPM answer that is not what the command promises (wrong size, unexpected structure).
    case unexpectedResponse
    /// An authorization value (the owner's) longer than a TPM takes (64 bytes).
    case authTooLong
    /// Any other TPM or TSS failure, with the command it came from.
    case command(String, code: UInt32)

    public var description: String {
        switch self {
        case .unavailable(let c): "no TPM answers at the configured TCTI (\(Self.text(c)))"
        case .sealedElsewhere(let c):
            "the TPM refused the sealed vault key: it was sealed by another machine's TPM, or this TPM was cleared, or the blob was altered (\(Self.text(c)))"
        case .pcrMismatch(let c):
            "the PCR values differ from the ones the vault key was sealed to (firmware, boot loader or kernel changed) (\(Self.text(c)))"
        case .blobMalformed: "the sealed vault key file is malformed"
        case .unexpectedResponse: "the TPM sent a malformed response"
        case .authTooLong: "the TPM owner authorization is longer than 64 bytes"
        case .command(let name, let c): "TPM command \(name) failed (\(Self.text(c)))"
        }
    }

    /// The TSS's own text for a response code, e.g. "tpm:parameter(2):integrity check failed".
    public static func text(_ rc: UInt32) -> String {
        let hex = "0x" + String(rc, radix: 16)
        guard let p = Tss2_RC_Decode(rc) else { return hex }
        return String(cString: p) + " " + hex
    }

    /// Sorts a failing response code into the cases above.
    static func classify(_ rc: TSS2_RC, command: String) -> TPMError {
        let layer = rc & 0xFF_0000
        let base = rc & 0xFFFF
        // TCTI layer (10 << 16): the transport failed; ESAPI-layer I/O and try-again likewise.
        if layer == 0x0A_0000 { return .unavailable(code: rc) }
        if layer == 0x07_0000 || layer == 0x08_0000, base == 8 /* NO_CONNECTION */ || base == 9 /* TRY_AGAIN */ || base == 10 /* IO_ERROR */ {
            return .unavailable(code: rc)
        }
        if layer == 0 && rc & 0x80 != 0 {
            // Format-one response: the low 6 bits are the error number.
            switch rc & 0x3F {
            case 0x1F /* INTEGRITY */, 0x25 /* BINDING */: return .sealedElsewhere(code: rc)
            case 0x1D /* POLICY_FAIL */: return .pcrMismatch(code: rc)
            default: break
            }
        }
        if layer == 0 && rc & 0xFFF == 0x128 /* PCR_CHANGED */ { return .pcrMismatch(code: rc) }
        return .command(command, code: rc)
    }
}

extension TSS2_RC {
    @inline(__always) func check(_ command: String) throws(TPMError) {
        if self != 0 { throw TPMError.classify(self, command: command) }
    }
}
