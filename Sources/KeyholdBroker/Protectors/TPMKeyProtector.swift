import KeyholdCore
import KeyholdVault
import KeyholdTPM

/// The vault key sealed by the TPM (`vault.key.tpm`). The TPM is reached only while the key
/// is sealed or unsealed (start-up, migration); the broker does not hold it open.
struct TPMKeyProtector: VaultKeyProtector {
    let access: TPMAccess
    /// PCRs a newly sealed key is bound to. Loading uses the PCRs recorded in the blob.
    let pcrs: PCRSelection

    var kind: KeyProtectorKind { .tpm }

    /// The sealed blob is small (two TPM2B structures); anything larger is not ours.
    static let maxBlobBytes = 4096

    func load(path: String) throws(StoreError) -> VaultKey {
        let bytes = try KeyFiles.read(path, maxBytes: Self.maxBlobBytes)
        let blob: SealedKeyBlob
        do throws(TPMError) { blob = try Self.parse(bytes) } catch { throw .keyProtector(Self.failure(error)) }
        let raw: SecureBytes
        do throws(TPMError) {
            let device = try access.open()
            raw = try device.unseal(blob) { SecureBytes(copying: $0) }
        } catch {
            // The PCR list comes from the blob: what the administrator must get back to.
            if case .pcrMismatch(let code) = error {
                throw .keyProtector(.pcrMismatch(pcrs: blob.pcrs.description, detail: TPMError.text(code)))
            }
            throw .keyProtector(Self.failure(error))
        }
        do { return try VaultKey(bytes: raw) } catch { throw .keyProtector(.blobMalformed) }
    }

    static func parse(_ bytes: SecureBytes) throws(TPMError) -> SealedKeyBlob {
        try bytes.withUnsafeBytes { (b) throws(TPMError) in try SealedKeyBlob(encoded: Array(b)) }
    }

    /// The PCRs the sealed key at `path` is bound to (`--tpm-pcrs` binds only a newly sealed
    /// key), for the start's audit entry; nil if the blob cannot be read.
    static func boundPCRs(path: String) -> PCRSelection? {
        guard let bytes = try? KeyFiles.read(path, maxBytes: maxBlobBytes) else { return nil }
        return try? parse(bytes).pcrs
    }

    func protect(_ key: VaultKey) throws(StoreError) -> SecureBytes {
        do throws(TPMError) {
            let device = try access.open()
            let blob = try key.withUnsafeKeyBytes { (raw) throws(TPMError) in try device.seal(raw, pcrs: pcrs) }
            return SecureBytes(copying: blob.encoded)
        } catch {
            throw .keyProtector(Self.failure(error))
        }
    }

    static func failure(_ error: TPMError) -> KeyProtectorFailure {
        switch error {
        case .unavailable: .tpmUnavailable(detail: error.description)
        case .sealedElsewhere: .sealedElsewhere(detail: error.description)
        case .pcrMismatch: .pcrMismatch(pcrs: "(unknown)", detail: error.description)
        case .blobMalformed, .unexpectedResponse: .blobMalformed
        case .command, .authTooLong: .tpmUnavailable(detail: error.description)
        }
    }
}
