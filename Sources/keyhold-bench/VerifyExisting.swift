import Glibc
import KeyholdVault

/// `keyhold-bench --verify-state DIR [--repeat N]`: times `audit verify` of an existing state
/// directory's chain (for profiling the verifier on a large log without seeding it again).
func verifyExisting(_ stateDirectory: String, repeats: Int) {
    let store: VaultStore
    do { store = try VaultStore.open(stateDirectory: stateDirectory) } catch {
        print("cannot open \(stateDirectory): \(error)")
        exit(1)
    }
    for _ in 0..<max(repeats, 1) {
        let t0 = now()
        let result = try! store.verifyAudit()
        let t = now() - t0
        guard case .intact(let count) = result else { print("audit verify: \(result)"); continue }
        print("audit verify of \(count) entries: \(String(format: "%.3f s, %.0f entries/s", t, Double(count) / t))")
    }
    store.close()
}
