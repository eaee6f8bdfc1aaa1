import Glibc
import KeyholdCore
import KeyholdVault

/// `keyholdd --migrate-key-protector tpm|file`: moves the vault to another key protector.
///
/// To `tpm` (issue 36 item 2) the vault gets a NEW vault key: the old one may survive in a
/// backup or a stray `vault.key`, and must open nothing written after the move. Order, each
/// step durable before the next, so a kill at any point leaves a vault the next start opens
/// (KeyProtectorSetup.openVault picks the key file the database was written under and
/// finishes the file steps) and running the migration again finishes it:
///   1. the new key sealed by the TPM into `vault.key.tpm.next`, and unsealed again to check it;
///   2. one transaction: the audit entry, everything re-keyed (VaultStore+Rekey.swift), the
///      record "tpm, counter pending";
///   3. `vault.key.tpm.next` renamed to `vault.key.tpm`; 4. `vault.key` removed;
///   5. the counter made with the new key's authorization (the next start does it otherwise).
/// To `file`: the same key written to `vault.key`; the record "file, counter retiring" with the
/// audit entry; the counter removed; the record "file"; `vault.key.tpm` removed. Run on a file
/// vault that the start refuses as a copy from before a move to the TPM, the same steps are the
/// administrator's explicit, audited decision to serve that copy with the file protector.
///
/// A vault the start would refuse (a rollback, a disturbed counter) is refused here too: a
/// move must not launder it.
enum KeyProtectorMigration {
    /// The points a test may kill the migration at (`KEYHOLD_TEST_MIGRATION_KILL_AFTER`).
    enum Step: String, CaseIterable {
        case loaded
        case sealed, committed, renamed, removed, established  // to tpm (committed, removed: both)
        case keyWritten = "key-written", counterRemoved = "counter-removed", recorded  // to file
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
        guard try KeyFiles.exists(options.stateDirectory) else { throw .io(code: ENOENT) }
        let access = try TPMAccess.load(options)
        var any = options
        any.keyProtector = .auto  // whatever the vault holds now
        let vault = try KeyProtectorSetup.openVault(any, access)
        killPoint(.loaded)
        switch target {
        case .tpm: return try toTPM(vault, any, access, executable)
        case .file: return try toFile(vault, any, access, executable)
        }
    }

    private static func toTPM(_ vault: KeyProtectorSetup.OpenedVault, _ options: BrokerOptions, _ access: TPMAccess,
                              _ executable: String) throws(StoreError) -> String {
        let dir = options.stateDirectory
        // Refuses a copy the start would refuse; makes a pending counter.
        _ = KeyProtectorStart.check(vault, options, access, executable: executable)
        if vault.kind == .tpm, vault.record?.kind == .tpm {
            vault.store.close()
            return "the vault key is already kept by the tpm protector"
        }
        let newKey = VaultKey.generate()
        let next = dir + "/" + KeyProtectorKind.nextTPMFileName, sealedPath = dir + "/" + KeyProtectorKind.tpm.fileName
        let sealer = KeyProtectorSetup.protector(.tpm, options, access)
        try KeyFiles.replace(next, with: try sealer.protect(newKey), directory: dir)
        // The sealed form must give the new key back before the vault is moved to it: after
        // the commit, nothing else holds that key.
        guard VaultStore.sameKey(try sealer.load(path: next), newKey) else {
            try KeyFiles.remove(next, directory: dir)
            throw .keyProtector(.blobMalformed)
        }
        killPoint(.sealed)
        let record = ProtectorRecord(kind: .tpm, counterIndex: vault.counterIndex, counter: .pending)
        try vault.store.rekey(to: newKey, record: record, audit: entry("from=\(vault.kind.rawValue) to=tpm new-vault-key", executable))
        killPoint(.committed)
        try KeyFiles.rename(next, to: sealedPath, directory: dir)
        killPoint(.renamed)
        try KeyFiles.remove(dir + "/" + KeyProtectorKind.file.fileName, directory: dir)
        killPoint(.removed)
        let reopened = try KeyProtectorSetup.openVault(options, access)
        defer { reopened.store.close() }
        _ = KeyProtectorStart.check(reopened, options, access, executable: executable)
        // The anchor file's tag is under the audit key, which is new.
        options.rollbackAnchor.map(RollbackAnchor.init(path:))?.advance(reopened.store)
        killPoint(.established)
        return "the vault key is now a new key sealed by the TPM (\(sealedPath)): an older key file or backup opens nothing written from now on"
    }

    private static func toFile(_ vault: KeyProtectorSetup.OpenedVault, _ options: BrokerOptions, _ access: TPMAccess,
                               _ executable: String) throws(StoreError) -> String {
        let dir = options.stateDirectory, store = vault.store
        defer { store.close() }
        if vault.kind == .tpm {
            // Refuses a rolled-back copy (the counter is checked before it goes).
            _ = KeyProtectorStart.check(vault, options, access, executable: executable)
            try KeyFiles.replace(dir + "/" + KeyProtectorKind.file.fileName, with: try FileKeyProtector().protect(vault.key), directory: dir)
            killPoint(.keyWritten)
        }
        let index = vault.counterIndex
        if vault.record?.counter != .retiring {
            try store.recordProtector(ProtectorRecord(kind: .file, counterIndex: index, counter: .retiring),
                                      audit: entry("from=\(vault.kind.rawValue) to=file counter-removed", executable))
            killPoint(.committed)
        }
        if access.configured {
            KeyProtectorStart.note("removing the TPM rollback counter 0x\(String(index, radix: 16))")
            try KeyProtectorStart.retire(TPMRollbackCounter(access: access, index: index, auth: store.rollbackCounterAuth), store)
            killPoint(.counterRemoved)
        } else {
            try store.recordProtector(ProtectorRecord(kind: .file, counterIndex: index, counter: .none), audit: nil)
        }
        killPoint(.recorded)
        for name in [KeyProtectorKind.tpm.fileName, KeyProtectorKind.nextTPMFileName] { try KeyFiles.remove(dir + "/" + name, directory: dir) }
        killPoint(.removed)
        return "the vault key is now kept by the file protector (\(dir)/\(KeyProtectorKind.file.fileName)); the sealed key and the TPM counter are removed"
    }

    private static func entry(_ reason: String, _ executable: String) -> AuditRecord {
        AuditRecord(callerUID: geteuid(), callerPID: getpid(), executable: executable,
                    operation: .keyProtectorMigrate, decision: .granted, reason: reason, outcome: .ok)
    }

    /// A protector that hands over a key already opened (so the store does not unseal twice).
    struct Loaded: VaultKeyProtector {
        let kind: KeyProtectorKind
        let key: VaultKey
        func load(path: String) throws(StoreError) -> VaultKey { key }
        func protect(_ key: VaultKey) throws(StoreError) -> SecureBytes { throw .keyFileInvalid }
    }
}
