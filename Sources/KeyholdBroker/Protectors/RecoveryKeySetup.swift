import Glibc
import KeyholdCore
import KeyholdVault

/// `keyholdd --create-recovery-key` (issue 39 item 1), run with the broker stopped, like
/// `--migrate-key-protector`: on an existing vault, or on an empty state directory (the vault
/// is created first). The vault key is wrapped under a new recovery key, the wrap recorded
/// with its audit entry, and the key printed once on stdout; it is never stored unwrapped.
///
/// Not done automatically when a serving broker creates a vault: the broker's stdout is the
/// service's journal, and the recovery key must reach a person, not a log.
enum RecoveryKeySetup {
    /// Creates (or replaces) the recovery key and prints it; returns the line for stderr.
    static func run(options: BrokerOptions, executable: String) throws(StoreError) -> String {
        let access = try TPMAccess.load(options)
        let vault = try KeyProtectorSetup.openVault(options, access)
        defer { vault.store.close() }
        // Refuses a rolled-back copy (a new recovery key must not launder it).
        _ = KeyProtectorStart.check(vault, options, access, executable: executable)
        let replaced = switch vault.store.recoveryState() {
        case .none: "none"
        case .stale: "stale"
        case .present(let id): id
        }
        let recovery = RecoveryKey.generate()
        let identity = Hex.encode(recovery.identity)
        let entry = AuditRecord(callerUID: geteuid(), callerPID: getpid(), executable: executable, operation: .recoveryKeyCreate,
                                decision: .granted, reason: "recovery-key=\(identity) replaced=\(replaced)", outcome: .ok)
        try vault.store.recordRecoveryKey(recovery, wrapping: vault.key, audit: entry)
        options.rollbackAnchor.map(RollbackAnchor.init(path:))?.advance(vault.store)
        let written = recovery.writtenForm
        written.withUnsafeBytes { _ = DescriptorIO.writeAll(1, $0) }
        _ = DescriptorIO.writeAll(1, "\n")
        var text = "keyholdd: the recovery key above (id \(identity)) opens every backup of this vault from now on; it is shown once and not stored: write it down or keep it offline"
        if replaced != "none" { text += ". The previous recovery key still opens backups made before" }
        return text
    }

    /// The start-up line: every start says when the vault cannot be recovered elsewhere.
    static func startLine(_ state: RecoveryState) -> String {
        switch state {
        case .present(let id): "recovery key: present (id \(id)); keyhold backup makes restorable backups"
        case .none: "recovery key: NONE: if this machine or its TPM is lost, every item is lost; create one with keyholdd --create-recovery-key (broker stopped)"
        case .stale: "recovery key: STALE (it wraps an older vault key): backups are refused; create a new one with keyholdd --create-recovery-key (broker stopped)"
        }
    }

    static func statusText(_ state: RecoveryState) -> String {
        switch state {
        case .present: "recovery-key=present"
        case .none: "recovery-key=none"
        case .stale: "recovery-key=stale"
        }
    }
}
