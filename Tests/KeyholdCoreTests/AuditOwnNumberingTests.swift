import Foundation
@testable import KeyholdCore
@testable import KeyholdVault
import Testing

/// A user's entries are numbered among their own. Read on from an entry already sent (a later
/// page, a poll of `audit --follow`), the numbering goes on from that entry's own number
/// without reading the user's older entries again, and is the numbering a whole read gives.
@Suite struct AuditOwnNumberingTests {
    @Test func readingOnFromAnEntryNumbersAsAWholeReadDoes() throws {
        let dir = TempDir()
        let store = try openStore(dir)
        // Three users interleaved, unevenly: 1000 every third entry, 1001 most of the rest.
        for i in 1...60 {
            let uid: UInt32 = i % 3 == 0 ? 1000 : (i % 7 == 0 ? 1002 : 1001)
            try store.append(record(.get, uid: uid, service: "svc\(i % 4)", account: "acct", reason: "r\(i)", method: .password, outcome: .ok))
        }
        for uid: UInt32 in [1000, 1001, 1002] {
            let whole = try store.auditEntries(visibleTo: uid)
            #expect(whole.map(\.ownSeq) == whole.indices.map { Int64($0 + 1) })
            for split in [0, 1, 5, whole.count - 1] where split < whole.count {
                let last = whole[split]
                let rest = try store.auditEntries(visibleTo: uid, afterSeq: last.seq, ownAfter: last.ownSeq)
                #expect(rest.map(\.seq) == whole.dropFirst(split + 1).map(\.seq), "uid \(uid) after \(split)")
                #expect(rest.map(\.ownSeq) == whole.dropFirst(split + 1).map(\.ownSeq), "uid \(uid) after \(split)")
                // With an item filter, as `audit --item` follows: the same entries, the same numbers.
                let filtered = try store.auditEntries(visibleTo: uid, item: ("svc1", "acct"), afterSeq: last.seq, ownAfter: last.ownSeq)
                let expected = whole.dropFirst(split + 1).filter { $0.readable.service == "svc1" }
                #expect(filtered.map(\.seq) == expected.map(\.seq) && filtered.map(\.ownSeq) == expected.map(\.ownSeq))
            }
        }
        // Root's view has no own numbers, and ownAfter changes nothing there.
        #expect(try store.auditEntries(visibleTo: nil, afterSeq: 10, ownAfter: 3).map(\.seq) == Array(11...60))
    }

    /// A user's entries are read through their index (migration 5), not by a scan of the log.
    @Test func aUsersEntriesAreFoundByTheirIndex() throws {
        let dir = TempDir()
        let store = try openStore(dir)
        for sql in ["SELECT count(*) FROM audit WHERE caller_uid = ?1",
                    "SELECT seq, row_number() OVER (ORDER BY seq) FROM audit WHERE caller_uid = ?1"] {
            let plan = try store.db.withStatement("EXPLAIN QUERY PLAN " + sql) { (s) throws(DatabaseError) -> String in
                var lines = ""
                while try s.step() { lines += s.text(3) + "\n" }
                return lines
            }
            #expect(plan.contains("audit_uid"), "\(plan)")
        }
    }
}
