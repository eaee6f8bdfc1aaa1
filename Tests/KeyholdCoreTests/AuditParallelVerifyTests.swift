import Foundation
@testable import KeyholdCore
@testable import KeyholdVault
import Testing

/// The fast path of `verifyAudit` (AuditChainScan.swift) must never call a damaged
/// chain intact, least of all at the seams between its slices; whatever it rejects, the
/// sequential pass names exactly as it did before.
@Suite struct AuditParallelVerifyTests {
    /// A vault with `n` audit entries (seq 1...n), closed. Seeded in a few transactions.
    private func seeded(_ n: Int) throws -> TempDir {
        let dir = TempDir()
        let store = try openStore(dir)
        try store.db.execute("PRAGMA synchronous=OFF")
        var i = 0
        while i < n {
            let batch = min(5_000, n - i)
            try store.db.transaction(mapError: { _ in StoreError.auditWriteFailed }) { () throws(StoreError) in
                for j in 0..<batch {
                    try store.writeAudit(record(.get, uid: (i + j) % 2 == 0 ? 1000 : 1001, service: "svc\(i + j)",
                                                account: "acct", reason: "r", method: .password))
                }
            }
            i += batch
        }
        store.close()
        return dir
    }

    private func raw(_ dir: TempDir) throws -> RawDatabase { try RawDatabase(dir.state + "/vault.db") }

    /// The fast path's verdict with `slices` slices, and `verifyAudit`'s.
    private func check(_ dir: TempDir) throws -> (fast: Bool, verdict: AuditVerification) {
        let store = try openStore(dir)
        defer { store.close() }
        let head = try #require(try store.readHead())
        let fast = store.auditChainIntact(start: (0, store.genesisMAC), head: (head.seq, head.mac))
        return (fast, try store.verifyAudit())
    }

    /// Each slice opens its connection as every reader does: while another file (here an
    /// identical copy) is at the WAL's path, the fast path reads nothing and the sequential pass,
    /// on the store's own connection, answers; with the writer's file back, the fast path runs.
    /// Opened by path alone, a slice reads the copy and calls the chain intact.
    @Test func aSliceNeverReadsAFilePutAtTheVaultsPaths() throws {
        let dir = try seeded(60)
        let store = try openStore(dir)
        defer { store.close() }
        #expect(!store.fileIdentities.isEmpty)
        let head = try #require(try store.readHead())
        func fast() -> Bool { store.auditChainIntact(start: (0, store.genesisMAC), head: (head.seq, head.mac)) }
        #expect(fast())
        let wal = dir.state + "/vault.db-wal"
        #expect(rename(wal, wal + ".real") == 0)
        try FileManager.default.copyItem(atPath: wal + ".real", toPath: wal)
        #expect(!fast(), "a slice read the file put at the WAL's path")
        #expect(try store.verifyAudit() == .intact(count: 60))
        #expect(unlink(wal) == 0 && rename(wal + ".real", wal) == 0)
        #expect(fast())
    }

    @Test func intactChainPassesInEverySlicing() throws {
        let dir = try seeded(60)
        for slices in [1, 2, 3, 4, 7, 60] {
            let r = try check(dir)
            #expect(r.fast, "slices: \(slices)")
            #expect(r.verdict == .intact(count: 60))
        }
    }

    /// Slices of 15: boundaries after seq 15, 30 and 45.
    @Test(arguments: [15, 16, 30, 31, 45, 46, 60])
    func editedMACAtOrNearASeamIsCaught(seq: Int) throws {
        let dir = try seeded(60)
        try raw(dir).setBlob("audit", "mac", [UInt8](repeating: 7, count: 32), where: "seq = \(seq)")
        let r = try check(dir)
        #expect(!r.fast)
        #expect(r.verdict == .broken(seq: Int64(seq), problem: .altered))
    }

    @Test(arguments: [15, 16, 45])
    func editedEntryTagAtASeamIsCaught(seq: Int) throws {
        let dir = try seeded(60)
        try raw(dir).setBlob("audit", "entry_tag", [UInt8](repeating: 7, count: 32), where: "seq = \(seq)")
        let r = try check(dir)
        #expect(!r.fast)
        if case .intact = r.verdict { Issue.record("an edited entry tag verified") }
    }

    @Test(arguments: [1, 15, 16, 30])
    func deletedRowAtASeamIsCaught(seq: Int) throws {
        let dir = try seeded(60)
        try raw(dir).exec("DELETE FROM audit WHERE seq = \(seq)")
        let r = try check(dir)
        #expect(!r.fast)
        #expect(r.verdict == .broken(seq: Int64(seq), problem: .removed))
    }

    @Test func rowBeyondTheHeadIsCaught() throws {
        let dir = try seeded(60)
        try raw(dir).exec("""
            INSERT INTO audit (seq, time_us, caller_uid, caller_pid, executable, operation, item_id, details,
                decision, method, outcome, entry_tag, mac)
            SELECT 61, time_us, caller_uid, caller_pid, executable, operation, item_id, details,
                decision, method, outcome, entry_tag, mac FROM audit WHERE seq = 60
            """)
        let r = try check(dir)
        #expect(!r.fast)
        // A copy of the genuine last entry: the sequential pass calls it out of place.
        #expect(r.verdict == .broken(seq: 61, problem: .reordered))
    }

    @Test func swappedNeighboursAcrossASeamAreCaught() throws {
        let dir = try seeded(60)
        try raw(dir).exec("""
            UPDATE audit SET seq = -15 WHERE seq = 15;
            UPDATE audit SET seq = 15 WHERE seq = 16;
            UPDATE audit SET seq = 16 WHERE seq = -15;
            """)
        let r = try check(dir)
        #expect(!r.fast)
        #expect(r.verdict == .broken(seq: 15, problem: .reordered))
    }

    /// Large enough that the default slicing uses every core on this machine.
    @Test func largeLogVerifiesOnAllCoresAndAnEditIsNamed() throws {
        let n = 40_000
        let dir = try seeded(n)
        #expect(try openStore(dir).verifyAudit() == .intact(count: Int64(n)))
        try raw(dir).exec("UPDATE audit SET outcome = 'denied' WHERE seq = 30001")
        #expect(try openStore(dir).verifyAudit() == .broken(seq: 30001, problem: .altered))
    }
}
