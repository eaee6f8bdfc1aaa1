import Glibc
import KeyholdCore
import KeyholdVault
import KeyholdTPM

/// How the broker reaches the TPM: the TCTI, and the owner hierarchy's authorization when the
/// TPM has one (issue 36 item 3). The storage primary key that seals the vault key and the
/// rollback counter's definition are made under the owner hierarchy, so without its password
/// a TPM whose owner set one can neither seal nor count.
///
/// The password comes from a systemd credential: `LoadCredential=tpm-owner-auth:/etc/keyhold/tpm-owner-auth`
/// (a root-only file) or `SetCredentialEncrypted=`, which systemd places in
/// `$CREDENTIALS_DIRECTORY/tpm-owner-auth`, readable by the service alone and never in its
/// environment or argv. A broker started by hand reads the same name from a root-only
/// directory named in CREDENTIALS_DIRECTORY. The file holds the password's bytes (one
/// trailing newline is dropped), at most 64; the same checks as the vault key file apply
/// (a regular file owned by the broker's user, no group or other bits, no symlink).
struct TPMAccess: Sendable {
    let tcti: String
    let ownerAuth: SecureBytes?

    static let credentialName = "tpm-owner-auth"

    static func load(_ options: BrokerOptions) throws(StoreError) -> TPMAccess {
        guard let dir = getenv("CREDENTIALS_DIRECTORY").map({ String(cString: $0) }), !dir.isEmpty else {
            return TPMAccess(tcti: options.tpmTCTI, ownerAuth: nil)
        }
        let path = dir + "/" + credentialName
        guard try KeyFiles.exists(path) else { return TPMAccess(tcti: options.tpmTCTI, ownerAuth: nil) }
        let raw = try KeyFiles.read(path, maxBytes: 65)
        let count = raw.withUnsafeBytes { $0.last == UInt8(ascii: "\n") ? $0.count - 1 : $0.count }
        guard count > 0, count <= 64 else { throw .keyProtector(.ownerAuthInvalid(path: path)) }
        return TPMAccess(tcti: options.tpmTCTI, ownerAuth: raw.withUnsafeBytes { SecureBytes(copying: UnsafeRawBufferPointer(rebasing: $0[0..<count])) })
    }

    /// One short connection (TPMDevice): opened for one job, dropped after.
    func open() throws(TPMError) -> TPMDevice {
        guard let ownerAuth else { return try TPMDevice(tcti: tcti) }
        return try ownerAuth.withUnsafeBytes { (b) throws(TPMError) in try TPMDevice(tcti: tcti, ownerAuth: b) }
    }

    /// Whether this machine has a TPM to ask at all: a TCTI named by the administrator, or
    /// the kernel's resource manager.
    var configured: Bool { tcti != TPMDevice.defaultTCTI || access("/dev/tpmrm0", F_OK) == 0 }
}
