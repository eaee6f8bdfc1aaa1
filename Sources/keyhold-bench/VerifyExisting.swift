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

func benchAuditEntry(_ i: Int) -> AuditRecord {
    AuditRecord(callerUID: 0, callerPID: 1, executable: "/usr/bin/bench", operation: .get, itemID: nil,
                service: "bench.example", account: "user-\(i)", decision: .granted, method: .none,
                reason: nil, outcome: .ok)
}

/// Appends entries `from..<to`, 10,000 per commit (the chain is the same as one commit each;
/// only the fsyncs are saved).
func seedAudit(_ store: VaultStore, from: Int, to: Int) {
    var next = from
    while next < to {
        let upTo = min(to, next + 10_000)
        precondition(store.groupTransaction {
            for i in next..<upTo { try! store.memberTransaction { () throws(StoreError) in try store.append(benchAuditEntry(i)) } }
        })
        next = upTo
    }
}
