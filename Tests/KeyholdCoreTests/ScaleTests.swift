import Foundation
@testable import KeyholdCore
@testable import KeyholdVault
import Testing

/// Scale checks, run on demand (`KEYHOLD_SCALE=1 swift test -c release --filter ScaleTests`):
/// they print timings for the README's benchmark and assert only correctness, never time.
@Suite(.enabled(if: ProcessInfo.processInfo.environment["KEYHOLD_SCALE"] == "1"), .serialized)
struct ScaleTests {
    private func seconds(_ body: () throws -> Void) rethrows -> Double {
        let start = DispatchTime.now().uptimeNanoseconds
        try body()
        return Double(DispatchTime.now().uptimeNanoseconds - start) / 1e9
    }

    @Test func list100kItems() throws {
        let dir = TempDir()
        let store = try openStore(dir)
        // Seeding only: skip fsync so 100,000 transactions do not take minutes.
        try store.db.execute("PRAGMA synchronous=OFF")
        let n = 100_000
        let seed = try seconds {
            for i in 0..<n {
                _ = try store.add(owner: 1000, NewItem(service: "service-\(i)", account: "account", label: "label \(i)"),
                                  secret: secret("secret-\(i)"), audit: record())
            }
        }
        var listed: (items: [StoredItem], damaged: Int) = ([], 0)
        let list = try seconds { listed = try store.items(owner: 1000) }
        #expect(listed.items.count == n && listed.damaged == 0)
        let repeats = Int(ProcessInfo.processInfo.environment["KEYHOLD_SCALE_REPEAT"] ?? "1") ?? 1
        let listAgain = try seconds { for _ in 0..<repeats { listed = try store.items(owner: 1000) } } / Double(repeats)
        // The SQLite part alone: step through the same rows, copying the columns.
        var rows = 0
        let scan = try seconds {
            try store.db.withStatement("SELECT \(VaultStore.itemColumns) FROM items WHERE owner_uid = ?1 ORDER BY rowid") { (s) throws(DatabaseError) in
                try s.bind(1, 1000)
                while try s.step() { _ = VaultStore.ItemRow(s); rows += 1 }
            }
        }
        print("SCALE list again: \(listAgain) s; SQLite scan alone: \(scan) s (\(rows) rows)")
        var lookup = 0.0
        lookup = try seconds {
            for i in stride(from: 0, to: n, by: 10) {
                let item = try #require(try store.item(owner: 1000, service: "service-\(i)", account: "account"))
                _ = try store.openSecret(item)
            }
        }
        print("SCALE add (no fsync) \(n): \(seed) s; list \(n): \(list) s; get+open \(n / 10): \(lookup) s")
    }

    @Test func verifyMillionAuditEntries() throws {
        let dir = TempDir()
        let store = try openStore(dir)
        try store.db.execute("PRAGMA synchronous=OFF")
        let n = 1_000_000
        let entry = record(.get, service: "svc", account: "acct", reason: "nightly sync", method: .password)
        let seed = try seconds {
            // Batched so seeding takes seconds; each batch is one transaction like append's.
            var i = 0
            while i < n {
                try store.db.transaction(mapError: { _ in StoreError.auditWriteFailed }) { () throws(StoreError) in
                    for _ in 0..<1000 { try store.writeAudit(entry) }
                }
                i += 1000
            }
        }
        var result = AuditVerification.intact(count: 0)
        let verify = try seconds { result = try store.verifyAudit() }
        #expect(result == .intact(count: Int64(n)))
        try store.db.execute("PRAGMA synchronous=FULL")
        let appends = 200
        let append = try seconds { for _ in 0..<appends { try store.append(entry) } }
        print("SCALE audit seed \(n): \(seed) s; verify \(n): \(verify) s; durable append: \(append / Double(appends) * 1000) ms each")
    }
}
