import Glibc
import KeyholdCore
import KeyholdVault
import KeyholdTPM

/// `--key-protector`: which protector keeps the vault key.
public enum KeyProtectorChoice: String, Sendable, Equatable {
    /// An existing vault keeps its protector; a new vault is sealed by the TPM when the
    /// kernel's resource manager exists, else kept in `vault.key`.
    case auto
    case file
    case tpm
}

/// Chooses the key protector for a start of the broker and says plainly what it protects.
enum KeyProtectorSetup {
    static func protector(_ kind: KeyProtectorKind, _ options: BrokerOptions, _ access: TPMAccess) -> any VaultKeyProtector {
        switch kind {
        case .file: FileKeyProtector()
        case .tpm: TPMKeyProtector(access: access, pcrs: options.tpmPCRs)
        }
    }

    /// The vault as opened, with the key file it was opened from and its verified record.
    struct OpenedVault {
        var store: VaultStore
        var kind: KeyProtectorKind
        let key: VaultKey
        let record: ProtectorRecord?
        /// The NV index of its TPM counter (recorded, or the one a move to the TPM would use).
        var counterIndex: UInt32 { record?.counterIndex ?? store.defaultCounterIndex }
    }

    /// Opens the vault with the key file that opens it. A migration can leave two or three
    /// key files side by side (`vault.key.tpm.next`, `vault.key.tpm`, `vault.key`); the one
    /// whose key the database was written under is used, and the files the migration would
    /// have removed are removed (finishing it), never one that does not open this vault.
    /// Refusing what must not be served is KeyProtectorStart's job (it needs the TPM).
    static func openVault(_ options: BrokerOptions, _ access: TPMAccess) throws(StoreError) -> OpenedVault {
        let dir = options.stateDirectory
        let next = (kind: KeyProtectorKind.tpm, name: KeyProtectorKind.nextTPMFileName)
        let tpm = (kind: KeyProtectorKind.tpm, name: KeyProtectorKind.tpm.fileName)
        let file = (kind: KeyProtectorKind.file, name: KeyProtectorKind.file.fileName)
        let order = switch options.keyProtector {
        case .auto: [next, tpm, file]
        case .tpm: [next, tpm]
        case .file: [file]
        }
        var candidates: [(kind: KeyProtectorKind, name: String)] = []
        for c in order where try KeyFiles.exists(dir + "/" + c.name) { candidates.append(c) }
        guard !candidates.isEmpty else { return try openWithoutKeyFile(options, access) }

        var keys: [VaultKey] = [], loaded: [(kind: KeyProtectorKind, name: String)] = []
        var unsealError: StoreError?
        for c in candidates {
            do throws(StoreError) {
                keys.append(try protector(c.kind, options, access).load(path: dir + "/" + c.name))
                loaded.append(c)
            } catch { unsealError = unsealError ?? error }
        }
        guard let at = try VaultStore.matchingKey(keys, stateDirectory: dir) else {
            if let unsealError { throw unsealError }
            if VaultStore.unverifiedProtectorKind(stateDirectory: dir) == .tpm {
                throw .keyProtector(.downgrade(detail: "the vault records that its key is sealed by the TPM, and no key file here opens it (\(loaded.map(\.name).joined(separator: ", ")) is not its key: a copy from before the move to the TPM?)"))
            }
            // A new vault beside an orphan key file, or a key file that is not this vault's:
            // the store's own open says which.
            guard let first = loaded.first else { throw .keyFileInvalid }
            let store = try VaultStore.open(stateDirectory: dir, keyProtector: KeyProtectorMigration.Loaded(kind: first.kind, key: keys[0]))
            return OpenedVault(store: store, kind: first.kind, key: keys[0], record: try store.protectorRecord())
        }
        let chosen = loaded[at], key = keys[at]
        // Killed after the re-keyed database committed: its key is the sealed one now.
        if chosen.name == next.name { try KeyFiles.rename(dir + "/" + next.name, to: dir + "/" + tpm.name, directory: dir) }
        let store = try VaultStore.open(stateDirectory: dir, keyProtector: KeyProtectorMigration.Loaded(kind: chosen.kind, key: key))
        let record: ProtectorRecord?
        do { record = try store.protectorRecord() } catch { store.close(); throw error }
        var opened = OpenedVault(store: store, kind: chosen.kind, key: key, record: record)
        if chosen.kind == .tpm, record?.kind == .file, options.keyProtector == .auto {
            // Moved to `file` (same key), killed before the sealed copy was removed.
            guard keys.indices.contains(where: { loaded[$0].kind == .file && VaultStore.sameKey(keys[$0], key) }) else {
                store.close()
                throw .keyFileInvalid
            }
            opened.kind = .file
            try KeyFiles.remove(dir + "/" + tpm.name, directory: dir)
        } else if chosen.kind == .tpm, record?.kind != .file {
            // The key file from before the move to the TPM (or a copy put back): it opens
            // nothing of this vault any more, and the migration would have removed it.
            try KeyFiles.remove(dir + "/" + file.name, directory: dir)
        }
        if opened.kind == .file { try KeyFiles.remove(dir + "/" + next.name, directory: dir) }
        return opened
    }

    /// A state directory without any key file: a new vault (or a database whose key is gone,
    /// which the store refuses). `auto` seals a new vault's key with the TPM when there is one.
    private static func openWithoutKeyFile(_ options: BrokerOptions, _ access: TPMAccess) throws(StoreError) -> OpenedVault {
        let kind: KeyProtectorKind = switch options.keyProtector {
        case .auto: access.configured ? .tpm : .file
        case .file: try KeyFiles.exists(options.stateDirectory + "/" + KeyProtectorKind.tpm.fileName) ? .tpm : .file
        case .tpm: try KeyFiles.exists(options.stateDirectory + "/" + KeyProtectorKind.file.fileName) ? .file : .tpm
        }
        let wanted: KeyProtectorKind = options.keyProtector == .file ? .file : options.keyProtector == .tpm ? .tpm : kind
        guard kind == wanted else { throw .keyProtector(.protectedBy(kind, wanted: wanted)) }
        let store = try VaultStore.open(stateDirectory: options.stateDirectory, keyProtector: protector(kind, options, access))
        return OpenedVault(store: store, kind: kind, key: try loadBack(kind, options, access), record: try store.protectorRecord())
    }

    private static func loadBack(_ kind: KeyProtectorKind, _ options: BrokerOptions, _ access: TPMAccess) throws(StoreError) -> VaultKey {
        try protector(kind, options, access).load(path: options.stateDirectory + "/" + kind.fileName)
    }

    /// The PCRs the sealed key in the state directory is bound to (nil for `file`, or when the
    /// blob cannot be read): read once per start, for the start-up line and the audit entry.
    static func boundPCRs(_ kind: KeyProtectorKind, _ options: BrokerOptions) -> PCRSelection? {
        kind == .tpm ? TPMKeyProtector.boundPCRs(path: options.stateDirectory + "/" + KeyProtectorKind.tpm.fileName) : nil
    }

    /// The start-up line: what an administrator must know about where the key is.
    static func startLine(_ kind: KeyProtectorKind, _ options: BrokerOptions, bound: PCRSelection?) -> String {
        switch kind {
        case .tpm:
            "key protector: tpm (TCTI \(options.tpmTCTI)): the vault key is sealed by this machine's TPM" + pcrText(options, bound: bound)
                + "; rollback is detected by a TPM counter only this vault key can write"
        case .file:
            "key protector: file: the vault key sits on disk in \(options.stateDirectory)/\(KeyProtectorKind.file.fileName) (a copy of the state directory opens every item without an app password); " + rollbackLine(options)
        }
    }

    /// The PCRs the sealed key is bound to, and a warning when `--tpm-pcrs` asks for others:
    /// it binds only a newly sealed key, so it is ignored for an existing one.
    static func pcrText(_ options: BrokerOptions, bound: PCRSelection?) -> String {
        guard let bound else { return "" }
        var text = bound.isEmpty ? " (bound to no PCRs)" : " (bound to PCRs \(bound))"
        if !options.tpmPCRs.isEmpty && options.tpmPCRs != bound {
            text += "; --tpm-pcrs \(options.tpmPCRs) is ignored: the key is already sealed (to change the PCRs, --migrate-key-protector file, then tpm)"
        }
        return text
    }

    static func rollbackLine(_ options: BrokerOptions) -> String {
        if let a = options.rollbackAnchor {
            return "rollback of the state directory alone is detected by the anchor \(a) (restoring the whole disk is NOT)"
        }
        return "rollback of the state directory is NOT detected"
    }

    /// The audit entry of every start: proof in the chain of how the key was kept (the PCRs
    /// the sealed blob names, whatever `--tpm-pcrs` says this time).
    static func startAudit(_ kind: KeyProtectorKind, bound: PCRSelection?, executable: String) -> AuditRecord {
        let reason = kind == .tpm ? "key-protector=tpm pcrs=\(bound?.description ?? "unknown")" : "key-protector=file"
        return AuditRecord(time: currentMicroseconds(), callerUID: geteuid(), callerPID: getpid(), executable: executable,
                           operation: .brokerStart, decision: .granted, reason: reason, outcome: .ok)
    }
}

/// What `keyhold status` reports: the key protector and which rollback detection runs.
struct VaultProtection: Sendable {
    let keyProtector: KeyProtectorKind
    var anchored = false
    var recovery = RecoveryState.none
    var statusText: String {
        let detection = [keyProtector == .tpm ? "tpm-counter" : nil, anchored ? "anchor-file" : nil].compactMap { $0 }
        return "key-protector=\(keyProtector.rawValue) rollback-detection=\(detection.isEmpty ? "none" : detection.joined(separator: "+")) \(RecoveryKeySetup.statusText(recovery))"
    }
}
