import Foundation
import KeyholdCore
import KeyholdVault
import Testing

/// The export verifier on real stores: exports verify on their own (also after the entries were
/// pruned), and every kind of edit of an exported row or header names the exact seq.
@Suite struct AuditExportVerifierTests {
    /// An open vault and its directory, which lives as long as the vault is used.
    final class Seeded {
        let dir = TempDir()
        var store: VaultStore
        init() throws { store = try openStore(dir) }
    }

    /// A vault with `n` audit entries (seq 1...n), open.
    private func seeded(_ n: Int) throws -> Seeded {
        let seeded = try Seeded()
        let store = seeded.store
        for i in 1...n {
            let item = try store.add(owner: 1000 + UInt32(i % 2), NewItem(service: "svc\(i)", account: "acct"),
                                     secret: secret("never-in-export-\(i)"),
                                     audit: record(.put, uid: 1000 + UInt32(i % 2), service: "svc\(i)", account: "acct",
                                                   reason: "reason \(i)", method: .password))
            _ = item
        }
        return seeded
    }

    /// Reads an export in small pages, as the broker streams it.
    private func export(_ store: VaultStore, through: Int64?) throws -> (AuditExportHeader, [AuditExportRow]) {
        let h = try store.auditExportHeader(throughSeq: through)
        var rows: [AuditExportRow] = []
        var cursor = (seq: h.startSeq, mac: h.startMAC)
        while cursor.seq < h.throughSeq {
            let page = try store.auditExportRows(after: cursor.seq, previousMAC: cursor.mac, through: h.throughSeq, limit: 3)
            let last = try #require(page.last)
            rows += page
            cursor = (last.seq, last.mac)
        }
        return (h, rows)
    }

    private func verify(_ store: VaultStore, _ h: AuditExportHeader, _ rows: [AuditExportRow]) -> AuditExportVerification {
        AuditExportVerifier.verify(rows, with: store.auditExportVerifier(h))
    }

    @Test func untouchedExportVerifiesAlsoAfterPrune() throws {
        let vault = try seeded(10)
        let store = vault.store
        defer { withExtendedLifetime(vault) {} }
        let (h, rows) = try export(store, through: 6)
        #expect(h.startSeq == 0 && h.throughSeq == 6 && h.count == 6)
        #expect(rows.map(\.seq) == [1, 2, 3, 4, 5, 6])
        #expect(rows[0].previousMAC == h.startMAC && rows[5].mac == h.throughMAC)
        #expect(rows[2].readable.service == "svc3" && rows[2].readable.reason == "reason 3" && rows[2].readable.operation == "put")
        #expect(rows[2].readable.itemID != nil && rows[2].readable.method == "password")
        #expect(verify(store, h, rows) == .intact(count: 6))

        try store.pruneAudit(throughSeq: 6, audit: record(.auditPrune, uid: 0))
        #expect(try store.verifyAudit() == .intact(count: 5))
        // The pruned entries' export still verifies: only the key is needed.
        #expect(verify(store, h, rows) == .intact(count: 6))
        // The next export starts at the checkpoint, where the first one ended.
        let (h2, rows2) = try export(store, through: 11)
        #expect(h2.startSeq == 6 && h2.startMAC == h.throughMAC && rows2.map(\.seq) == [7, 8, 9, 10, 11])
        #expect(verify(store, h2, rows2) == .intact(count: 5))
        // Nothing after the start: an empty export.
        let (h3, rows3) = try export(store, through: nil)
        #expect(h3.count == 0 && rows3.isEmpty && verify(store, h3, rows3) == .intact(count: 0))

        // No secret byte is in any exported row.
        for r in rows + rows2 {
            #expect(!contains(r.row, Array("never-in-export".utf8)))
        }
    }

    @Test func editsNameTheExactSeq() throws {
        let vault = try seeded(8)
        let store = vault.store
        defer { withExtendedLifetime(vault) {} }
        let (h, rows) = try export(store, through: 8)
        func check(_ expected: AuditExportVerification, _ edit: (inout [AuditExportRow]) -> Void,
                   sourceLocation: SourceLocation = #_sourceLocation) {
            var r = rows
            edit(&r)
            #expect(verify(store, h, r) == expected, sourceLocation: sourceLocation)
        }
        // Readable fields: each differs from what the row decodes to.
        check(.broken(seq: 3, problem: .readableMismatch)) { $0[2].readable.outcome = "denied" }
        check(.broken(seq: 4, problem: .readableMismatch)) { $0[3].readable.service = "svc-other" }
        check(.broken(seq: 2, problem: .readableMismatch)) { $0[1].readable.reason = nil }
        check(.broken(seq: 5, problem: .readableMismatch)) { $0[4].readable.time += 1 }
        check(.broken(seq: 6, problem: .readableMismatch)) { $0[5].readable.callerUID = 0 }
        check(.broken(seq: 1, problem: .readableMismatch)) { $0[0].readable.itemID = nil }
        check(.broken(seq: 7, problem: .readableMismatch)) { $0[6].readable.executable = "/usr/bin/other" }
        // MACs, row bytes, links.
        check(.broken(seq: 4, problem: .altered)) { $0[3].mac[0] ^= 1 }
        check(.broken(seq: 2, problem: .altered)) { $0[1].row[9] ^= 1 }
        check(.broken(seq: 3, problem: .altered)) { $0[2].row[$0[2].row.count - 20] ^= 1 }  // inside the sealed details
        check(.broken(seq: 5, problem: .altered)) { $0[4].previousMAC[31] ^= 1 }
        check(.broken(seq: 5, problem: .altered)) { $0[4].row.append(0) }
        // Lines deleted, swapped, repeated, cut off, appended.
        check(.broken(seq: 4, problem: .removed)) { $0.remove(at: 3) }
        check(.broken(seq: 1, problem: .removed)) { $0.remove(at: 0) }
        check(.broken(seq: 4, problem: .reordered)) { $0.swapAt(3, 4) }
        check(.broken(seq: 2, problem: .reordered)) { $0.swapAt(1, 6) }
        check(.broken(seq: 4, problem: .inserted)) { $0.insert($0[2], at: 3) }
        check(.broken(seq: 8, problem: .truncated)) { $0.removeLast() }
        check(.broken(seq: 1, problem: .truncated)) { $0.removeAll() }
        // Swapped lines whose seqs were relabelled to look in order: the chain breaks there.
        check(.broken(seq: 4, problem: .altered)) { r in r.swapAt(3, 4); r[3].seq = 4; r[4].seq = 5 }
        // A genuine row from later in the chain appended past the header's end.
        try store.append(record(.list))
        let later = try export(store, through: 9).1
        check(.broken(seq: 9, problem: .inserted)) { $0.append(later[8]) }
    }

    @Test func headerEditsAreCaught() throws {
        let vault = try seeded(5)
        let store = vault.store
        defer { withExtendedLifetime(vault) {} }
        let (h, rows) = try export(store, through: 5)
        var cut = h
        cut.throughSeq = 4
        cut.throughMAC = rows[3].mac  // a consistent-looking end without the key's tag
        #expect(verify(store, cut, Array(rows.prefix(4))) == .broken(seq: 0, problem: .header))
        var tag = h
        tag.tag[0] ^= 1
        #expect(verify(store, tag, rows) == .broken(seq: 0, problem: .header))
        var start = h
        start.startSeq = 1
        #expect(verify(store, start, rows) == .broken(seq: 0, problem: .header))
        var empty = h
        empty.tag = []
        #expect(verify(store, empty, rows) == .broken(seq: 0, problem: .header))

        // Another vault's export (its own key) does not verify here, header or rows.
        let otherVault = try seeded(5)
        let other = otherVault.store
        defer { withExtendedLifetime(otherVault) {} }
        let (oh, orows) = try export(other, through: 5)
        #expect(verify(store, oh, orows) == .broken(seq: 0, problem: .header))
        #expect(verify(store, h, orows) == .broken(seq: 1, problem: .altered))
    }

    @Test func hostileRowsNeverCrash() throws {
        let vault = try seeded(3)
        let store = vault.store
        defer { withExtendedLifetime(vault) {} }
        let (h, rows) = try export(store, through: 3)
        var r = rows
        r[0].mac = []
        #expect(verify(store, h, r) == .broken(seq: 1, problem: .altered))
        r = rows
        r[0].previousMAC = []
        #expect(verify(store, h, r) == .broken(seq: 1, problem: .altered))
        r = rows
        r[1].row = []
        #expect(verify(store, h, r) == .broken(seq: 2, problem: .altered))
        r = rows
        r[1].row = [UInt8](repeating: 0xff, count: AuditExportRow.maxRowBytes + 1)
        #expect(verify(store, h, r) == .broken(seq: 2, problem: .altered))
        r = rows
        r[2].seq = Int64.max
        #expect(verify(store, h, r) == .broken(seq: 3, problem: .removed))
        r = rows
        r[0].seq = Int64.min
        #expect(verify(store, h, r) == .broken(seq: 1, problem: .inserted))
        // Random byte flips in rows: always a failure at that row, never a crash (bounded).
        var rng = SystemRandomNumberGenerator()
        for _ in 0..<500 {
            var rr = rows
            let i = Int.random(in: 0..<rr.count, using: &rng)
            let at = Int.random(in: 0..<rr[i].row.count, using: &rng)
            rr[i].row[at] ^= UInt8.random(in: 1...255, using: &rng)
            #expect(verify(store, h, rr) == .broken(seq: rr[i].seq, problem: .altered))
        }
    }

    @Test func exportRefusesABrokenChain() throws {
        let vault = try seeded(6)
        let dir = vault.dir
        vault.store.close()
        try RawDatabase(dir.state + "/vault.db").exec("UPDATE audit SET outcome = 'denied' WHERE seq = 4")
        let reopened = try openStore(dir)
        let h = try reopened.auditExportHeader(throughSeq: 6)
        #expect(try reopened.auditExportRows(after: 0, previousMAC: h.startMAC, through: 6, limit: 3).count == 3)
        #expect(throws: StoreError.integrity) {
            _ = try reopened.auditExportRows(after: 3, previousMAC: try reopened.auditExportRows(
                after: 0, previousMAC: h.startMAC, through: 6, limit: 3)[2].mac, through: 6, limit: 3)
        }
        try RawDatabase(dir.state + "/vault.db").exec("DELETE FROM audit WHERE seq = 2")
        #expect(throws: StoreError.integrity) {
            _ = try reopened.auditExportRows(after: 0, previousMAC: h.startMAC, through: 6, limit: 10)
        }
    }
}
