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
    static func protector(_ kind: KeyProtectorKind, _ options: BrokerOptions) -> any VaultKeyProtector {
        switch kind {
        case .file: FileKeyProtector()
        case .tpm: TPMKeyProtector(tcti: options.tpmTCTI, pcrs: options.tpmPCRs)
        }
    }

    /// Which protector files the state directory holds now.
    static func present(in directory: String) throws(StoreError) -> [KeyProtectorKind] {
        var found: [KeyProtectorKind] = []
        for kind in KeyProtectorKind.allCases where try KeyFiles.exists(directory + "/" + kind.fileName) { found.append(kind) }
        return found
    }

    /// The protector this start uses. Both files present means a migration was interrupted
    /// after the new form was complete: both hold the same key, and the TPM's form is used.
    static func resolve(_ options: BrokerOptions) throws(StoreError) -> KeyProtectorKind {
        let found = try present(in: options.stateDirectory)
        switch options.keyProtector {
        case .auto:
            if found.contains(.tpm) { return .tpm }
            if found.contains(.file) { return .file }
            return options.tpmTCTI != TPMDevice.defaultTCTI || access("/dev/tpmrm0", F_OK) == 0 ? .tpm : .file
        case .file, .tpm:
            let wanted: KeyProtectorKind = options.keyProtector == .tpm ? .tpm : .file
            if found.isEmpty || found.contains(wanted) { return wanted }
            throw .keyProtector(.protectedBy(found[0], wanted: wanted))
        }
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
                + "; rollback is detected by a TPM counter"
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
    var statusText: String {
        let detection = [keyProtector == .tpm ? "tpm-counter" : nil, anchored ? "anchor-file" : nil].compactMap { $0 }
        return "key-protector=\(keyProtector.rawValue) rollback-detection=\(detection.isEmpty ? "none" : detection.joined(separator: "+"))"
    }
}
