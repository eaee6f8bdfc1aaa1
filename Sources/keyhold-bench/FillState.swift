import Glibc
import KeyholdCore
import KeyholdVault

/// `keyhold-bench --fill-state DIR --owner UID --from A --to B`: adds items `bench` /
/// `acct-A` … `acct-B` with secrets `secret-N` for `owner`, straight into the store (the broker
/// stopped), each with its audit entry, as `keyhold put bench acct-N` would. For the Secret
/// Service benchmark: through the broker a user's audit budget allows a few puts a second.
func fillState(_ stateDirectory: String, owner: UInt32, from: Int, to: Int) {
    let store: VaultStore
    do { store = try VaultStore.open(stateDirectory: stateDirectory) } catch {
        print("cannot open \(stateDirectory): \(error)")
        exit(1)
    }
    defer { store.close() }
    guard from <= to else { return }
    for n in from...to {
        let audit = AuditRecord(callerUID: owner, callerPID: getpid(), executable: "/usr/bin/keyhold-bench", operation: .put,
                                decision: .granted, outcome: .ok)
        let secret = SecureBytes(copying: Array("secret-\(n)".utf8))
        do {
            try store.add(owner: owner, NewItem(service: "bench", account: "acct-\(n)"), secret: secret, audit: audit)
        } catch {
            print("cannot add item \(n): \(error)")
            exit(1)
        }
        secret.wipe()
    }
}
