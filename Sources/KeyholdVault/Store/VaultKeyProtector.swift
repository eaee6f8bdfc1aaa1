import KeyholdCore
import Glibc
import KeyholdCore

/// How the vault key is kept at rest in the state directory.
public enum KeyProtectorKind: String, Sendable, CaseIterable {
    /// `vault.key`: the 32 key bytes in a 0600 file. Anyone who reads the state directory
    /// (a backup, a disk image, a stolen disk) reads every item without an app password.
    case file
    /// `vault.key.tpm`: the key sealed by this machine's TPM; only the sealed blob is on disk.
    case tpm

    /// Where `--migrate-key-protector tpm` seals the new vault key until the vault is re-keyed
    /// to it (then it is renamed to `vault.key.tpm`).
    public static let nextTPMFileName = "vault.key.tpm.next"

    /// The file in the state directory that holds the key in this protector's form.
    public var fileName: String {
        switch self {
        case .file: StateDirectory.keyFileName
        case .tpm: "vault.key.tpm"
        }
    }
}

/// Why a key protector could not give the vault key. Texts say what to do; never key bytes.
public enum KeyProtectorFailure: Error, Equatable, Sendable, CustomStringConvertible {
    /// No TPM answers (no device, resource manager or simulator).
    case tpmUnavailable(detail: String)
    /// The sealed key belongs to another TPM, or this TPM was cleared: nothing opens.
    case sealedElsewhere(detail: String)
    /// The PCRs the key is bound to (`pcrs`, e.g. "0,7") changed (firmware, boot loader or
    /// kernel update).
    case pcrMismatch(pcrs: String, detail: String)
    /// The sealed-key file is not a Keyhold TPM blob.
    case blobMalformed
    /// The state directory holds the key under the other protector.
    case protectedBy(KeyProtectorKind, wanted: KeyProtectorKind)
    /// The vault was moved to the TPM and this start would serve it (or an older copy of it)
    /// with a weaker protector or without its counter; `detail` says which.
    case downgrade(detail: String)
    /// The TPM owner authorization credential is empty or longer than 64 bytes.
    case ownerAuthInvalid(path: String)

    public var description: String {
        switch self {
        case .tpmUnavailable(let d): "the vault key is sealed by a TPM, and no TPM answers: \(d)"
        case .sealedElsewhere(let d):
            "the vault key was sealed by another machine's TPM, or this machine's TPM was cleared since; it cannot be opened here (\(d))"
        case .pcrMismatch(let pcrs, let d):
            "the vault key is sealed to the values of PCRs \(pcrs) (SHA-256), and they changed since it was sealed (a firmware, boot loader or kernel update, or something extended them); the TPM released nothing. A re-seal is needed: boot the previous firmware/kernel (the vault opens there), run keyholdd --migrate-key-protector file, update, then --migrate-key-protector tpm; without the previous state only a backup kept with the file protector opens (\(d))"
        case .blobMalformed: "the sealed vault key file is malformed or was altered"
        case .protectedBy(let found, let wanted):
            "the vault key is kept by the \(found.rawValue) protector, not \(wanted.rawValue); convert it with keyholdd --migrate-key-protector \(wanted.rawValue)"
        case .downgrade(let d):
            "integrity failure: \(d); nothing is served. If this copy is what you want, keyholdd --migrate-key-protector file makes it a file-protected vault again (audited)"
        case .ownerAuthInvalid(let path): "the TPM owner authorization in \(path) is empty or longer than 64 bytes"
        }
    }

    public var outcome: Outcome {
        switch self {
        case .sealedElsewhere, .pcrMismatch, .blobMalformed, .downgrade: .integrityFailure
        case .tpmUnavailable, .protectedBy, .ownerAuthInvalid: .otherError
        }
    }
}

/// Reads and writes the vault key in one protected form. The file protector is today's
/// `vault.key`; the TPM protector lives in the broker (the only target linked with the TSS).
public protocol VaultKeyProtector {
    var kind: KeyProtectorKind { get }
    /// Opens the key kept at `path`.
    func load(path: String) throws(StoreError) -> VaultKey
    /// The bytes to write at `kind.fileName` for `key` (for the file protector: the key).
    func protect(_ key: VaultKey) throws(StoreError) -> SecureBytes
}

/// `vault.key`, as before key protectors existed.
public struct FileKeyProtector: VaultKeyProtector {
    public init() {}
    public var kind: KeyProtectorKind { .file }
    public func load(path: String) throws(StoreError) -> VaultKey { try StateDirectory.readKey(path) }
    public func protect(_ key: VaultKey) throws(StoreError) -> SecureBytes {
        key.withUnsafeBytes { SecureBytes(copying: $0) }
    }
}

extension VaultKey {
    /// The raw key bytes, for a key protector to seal. Nothing else may call this.
    public func withUnsafeKeyBytes<R, E: Error>(_ body: (UnsafeRawBufferPointer) throws(E) -> R) throws(E) -> R {
        try keyBytes.bytes.withUnsafeBytes(body)
    }
}

/// Small private files of the state directory (the key in any protected form): read with the
/// same checks as `vault.key`, written only by O_EXCL + fsync + rename, so a crash at any
/// point leaves either the old file or the complete new one.
public enum KeyFiles {
    /// Reads a regular file owned by the euid, 0600 or stricter, at most `maxBytes`.
    public static func read(_ path: String, maxBytes: Int) throws(StoreError) -> SecureBytes {
        let fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC)
        guard fd >= 0 else {
            if errno == ELOOP { throw .insecurePermissions(path: path) }
            throw .keyFileInvalid
        }
        defer { close(fd) }
        var st = stat()
        guard fstat(fd, &st) == 0 else { throw .io(code: errno) }
        try StateDirectory.checkOwnedPrivate(st, path: path, type: S_IFREG)
        guard st.st_size > 0, st.st_size <= maxBytes else { throw .keyFileInvalid }
        let out = SecureBytes(count: Int(st.st_size))
        let ok = out.withUnsafeMutableBytes { buf -> Bool in
            var done = 0
            while done < buf.count {
                let n = Glibc.read(fd, buf.baseAddress! + done, buf.count - done)
                if n < 0 && errno == EINTR { continue }
                guard n > 0 else { return false }
                done += n
            }
            var extra: UInt8 = 0
            return Glibc.read(fd, &extra, 1) == 0
        }
        guard ok else { throw .keyFileInvalid }
        return out
    }

    public static func exists(_ path: String) throws(StoreError) -> Bool { try StateDirectory.exists(path) }

    /// Writes `bytes` to `path` through `path.new` (0600, O_EXCL, fsync), renames it over
    /// `path` and fsyncs the directory. `afterTemporary` runs between the temporary file's
    /// fsync and the rename (the migration's kill point in tests).
    public static func replace(_ path: String, with bytes: SecureBytes, directory: String,
                               afterTemporary: () -> Void = {}) throws(StoreError) {
        let temporary = path + ".new"
        // A leftover from a crash is never the live key (only `path` is): remove it.
        if unlink(temporary) != 0 && errno != ENOENT { throw .io(code: errno) }
        let fd = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw .io(code: errno) }
        var failure: Int32 = fchmod(fd, 0o600) == 0 ? 0 : errno
        if failure == 0 {
            failure = bytes.withUnsafeBytes { DescriptorIO.writeAll(fd, $0) }
        }
        if failure == 0, fsync(fd) != 0 { failure = errno }
        close(fd)
        guard failure == 0 else { unlink(temporary); throw .io(code: failure) }
        afterTemporary()
        guard Glibc.rename(temporary, path) == 0 else { let e = errno; unlink(temporary); throw .io(code: e) }
        StateDirectory.syncDirectory(directory)
    }

    /// Renames `from` to `to` (replacing it: one atomic step) and fsyncs the directory.
    public static func rename(_ from: String, to: String, directory: String) throws(StoreError) {
        guard Glibc.rename(from, to) == 0 else { throw .io(code: errno) }
        StateDirectory.syncDirectory(directory)
    }

    /// Removes `path` (gone already is fine) and fsyncs the directory.
    public static func remove(_ path: String, directory: String) throws(StoreError) {
        if unlink(path) != 0 && errno != ENOENT { throw .io(code: errno) }
        StateDirectory.syncDirectory(directory)
    }
}
