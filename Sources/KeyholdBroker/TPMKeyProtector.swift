import KeyholdCore
import KeyholdVault
import KeyholdTPM

/// The vault key sealed by the TPM (`vault.key.tpm`). The TPM is reached only while the key
/// is sealed or unsealed (start-up, migration); the broker does not hold it open.
struct TPMKeyProtector: VaultKeyProtector {
    let tcti: String
    /// PCRs a newly sealed key is bound to. Loading uses the PCRs recorded in the blob.
    let pcrs: PCRSelection

    var kind: KeyProtectorKind { .tpm }

    /// The sealed blob is small (two TPM2B structures); anything larger is not ours.
    static let maxBlobBytes = 4096

    func load(path: String) throws(StoreError) -> VaultKey {
        let bytes = try KeyFiles.read(path, maxBytes: Self.maxBlobBytes)
        let raw: SecureBytes
        do throws(TPMError) {
            let blob = try bytes.withUnsafeBytes { (b) throws(TPMError) in try SealedKeyBlob(encoded: Array(b)) }
            let device = try TPMDevice(tcti: tcti)
            raw = try device.unseal(blob) { SecureBytes(copying: $0) }
        } catch {
            throw .keyProtector(Self.failure(error))
        }
        do { return try VaultKey(bytes: raw) } catch { throw .keyProtector(.blobMalformed) }
    }

    func protect(_ key: VaultKey) throws(StoreError) -> SecureBytes {
        do throws(TPMError) {
            let device = try TPMDevice(tcti: tcti)
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
        case .pcrMismatch: .pcrMismatch(detail: error.description)
        case .blobMalformed, .unexpectedResponse: .blobMalformed
        case .command: .tpmUnavailable(detail: error.description)
        }
    }
}
