import Glibc
import KeyholdCore
import KeyholdVault

/// `keyholdd --migrate-key-protector tpm|file`: converts the vault key in place.
///
/// Crash-safe by order: the new form is written to a temporary file, fsynced, renamed into
/// place and checked to open to the same key before the old form is removed. A kill at any
/// point leaves the old file (always complete) and at most a complete new one; both hold the
/// same key, so the next start opens the vault either way, and running the migration again
/// finishes it.
enum KeyProtectorMigration {
    /// The points a test may kill the migration at (`KEYHOLD_TEST_MIGRATION_KILL_AFTER`).
    enum Step: String, CaseIterable {
        case loaded, temporaryWritten = "temporary-written", renamed, audited, removed
    }

    /// TEST ONLY: when set to a step name, the migration SIGKILLs itself right after that
    /// step, so tests can show that every interruption leaves a working vault. Whoever can
    /// set the broker's environment is root already; the knob only ends the process.
    static let killVariable = "KEYHOLD_TEST_MIGRATION_KILL_AFTER"

    static func killPoint(_ step: Step) {
        if let v = getenv(killVariable), String(cString: v) == step.rawValue { kill(getpid(), SIGKILL) }
    }

    /// Runs the migration; returns the line to print.
    static func run(to target: KeyProtectorKind, options: BrokerOptions, executable: String) throws(StoreError) -> String {
        let directory = options.stateDirectory
        guard try KeyFiles.exists(directory) else { throw .io(code: ENOENT) }
        let found = try KeyProtectorSetup.present(in: directory)
        let source: KeyProtectorKind = target == .tpm ? .file : .tpm
        guard found.contains(source) else {
            if found.contains(target) { return "the vault key is already kept by the \(target.rawValue) protector" }
            throw .keyFileInvalid
        }
        let sourcePath = directory + "/" + source.fileName
        let targetPath = directory + "/" + target.fileName
        let key = try KeyProtectorSetup.protector(source, options).load(path: sourcePath)
        killPoint(.loaded)

        // Opening the store proves the key belongs to this vault before anything is written.
        let store = try VaultStore.open(stateDirectory: directory, keyProtector: Loaded(kind: source, key: key))
        defer { store.close() }
        let newProtector = KeyProtectorSetup.protector(target, options)
        try KeyFiles.replace(targetPath, with: try newProtector.protect(key), directory: directory,
                             afterTemporary: { killPoint(.temporaryWritten) })
        killPoint(.renamed)

        // The new form must give the same key back before the old one may go.
        let reopened = try newProtector.load(path: targetPath)
        let same = key.withUnsafeKeyBytes { a in reopened.withUnsafeKeyBytes { b in SecureBytes(copying: a).constantTimeEquals(SecureBytes(copying: b)) } }
        guard same else {
            try? KeyFiles.remove(targetPath, directory: directory)
            throw .keyFileInvalid
        }
        try store.append(AuditRecord(callerUID: geteuid(), callerPID: getpid(), executable: executable,
                                     operation: .keyProtectorMigrate, decision: .granted,
                                     reason: "from=\(source.rawValue) to=\(target.rawValue)", outcome: .ok))
        killPoint(.audited)
        try KeyFiles.remove(sourcePath, directory: directory)
        killPoint(.removed)
        return "the vault key is now kept by the \(target.rawValue) protector (\(targetPath)); \(sourcePath) removed"
    }

    /// A protector that hands over a key already opened (so the store does not unseal twice).
    struct Loaded: VaultKeyProtector {
        let kind: KeyProtectorKind
        let key: VaultKey
        func load(path: String) throws(StoreError) -> VaultKey { key }
        func protect(_ key: VaultKey) throws(StoreError) -> SecureBytes { throw .keyFileInvalid }
    }
}
