import Foundation
import Testing
@testable import KeyholdCore
@testable import KeyholdVault
import KeyholdTestSupport

/// Inside a group commit the writer does not read again what it read and checked earlier in the
/// same write transaction (the newest audit entry, the generation record) while
/// `Database.writeSnapshot` is unchanged: it moves when a write transaction begins or ends and
/// whenever writes may have been undone. Each test undoes writes between two members and checks
/// that what is committed is exactly right: an intact chain, the right generation, the right
/// secret released. Real SQLite files.
@Suite struct WriteSnapshotTests {
    @Test func theSnapshotMovesWithEveryTransactionBoundaryAndEveryUndo() throws {
        let dir = TempDir()
        let db = try Database(path: dir.path + "/t.db", create: true)
        try db.execute("CREATE TABLE t (k INTEGER PRIMARY KEY)")
        #expect(db.writeSnapshot == nil)
        var seen: [UInt64] = []
        let first = db.groupTransaction {
            guard let a = db.writeSnapshot else { return false }
            seen.append(a)
            try? db.execute("SELECT 1")  // raw SQL: taken as possibly anything
            let afterExec = db.writeSnapshot
            _ = try? db.withStatement("INSERT INTO t VALUES (1)") { (s) throws(DatabaseError) in try s.step() }
            #expect(db.writeSnapshot == afterExec)  // its own write: unchanged
            _ = try? db.withStatement("INSERT INTO t VALUES (1)") { (s) throws(DatabaseError) in try s.step() }  // fails
            #expect(db.writeSnapshot != afterExec)
            let beforeUndo = db.writeSnapshot
            struct Undone: Error {}
            _ = try? db.transaction(mapError: { $0 as Error }) { () throws(any Error) in
                try db.execute("INSERT INTO t VALUES (2)")
                throw Undone()
            }
            #expect(db.writeSnapshot != beforeUndo)  // a savepoint rolled back
            seen.append(db.writeSnapshot ?? 0)
            return true
        }
        #expect(first)
        #expect(db.writeSnapshot == nil)
        var next: UInt64?
        #expect(db.groupTransaction {
            next = db.writeSnapshot
            return true
        })
        #expect(next != nil && !seen.contains(next!))  // a new transaction
    }

    /// A member appends an entry and fails (its savepoint takes the entry back); a prune removes
    /// the newest entries: each following member chains onto the entry that is really the
    /// newest, and the log verifies after a restart.
    @Test func membersChainOntoTheTrueNewestEntryAfterAnUndoneMemberAndAPrune() throws {
        let dir = TempDir()
        let store = try openStore(dir)
        _ = try store.add(owner: 1000, NewItem(service: "svc", account: "acct"), secret: secret("v1"), audit: record())
        var acknowledged: [Bool] = []
        #expect(store.groupTransaction {
            acknowledged.append(GroupHeadTests.append(store, "a"))
            acknowledged.append(GroupHeadTests.append(store, "undone", fail: true))
            acknowledged.append(GroupHeadTests.append(store, "b"))
            acknowledged.append(GroupHeadTests.append(store, "undone-2", fail: true))
            acknowledged.append(GroupHeadTests.append(store, "undone-3", fail: true))
            acknowledged.append(GroupHeadTests.append(store, "c"))
        })
        #expect(acknowledged == [true, false, true, false, false, true])
        #expect(try store.verifyAudit() == .intact(count: 4))
        let entries = try store.auditEntries(visibleTo: nil)
        let newest = try #require(entries.map(\.seq).max())
        var later: [Bool] = []
        #expect(store.groupTransaction {
            later.append(GroupHeadTests.append(store, "d"))
            // Removes every entry of the first group, "c" the newest of them.
            later.append((try? store.memberTransaction { () throws(StoreError) -> Int64 in
                try store.pruneAudit(throughSeq: newest, audit: record(.auditPrune))
            }) != nil)
            later.append(GroupHeadTests.append(store, "e"))
        })
        #expect(later == [true, true, true])
        store.close()
        let reopened = try openStore(dir)
        #expect(try reopened.verifyAudit() == .intact(count: 3))
        #expect(try reopened.auditEntries(visibleTo: nil).compactMap(\.readable.reason) == ["d", "e"])
        let (head, last) = try GroupHeadTests.headAndNewest(dir)
        #expect(!head.isEmpty && head == last)
    }

    /// A member replaces the item and then fails (generation 2 taken back); the next member's
    /// release of the row read before must find the record at generation 1 again and release
    /// the first secret; a member that replaces and succeeds moves it to 2 for the one after.
    @Test func aReleaseAfterAnUndoneReplaceInTheSameGroupSeesTheGenerationThatWasKept() throws {
        let dir = TempDir()
        let store = try openStore(dir)
        let reader = try VaultReader.open(for: store)
        defer { reader.close() }
        let first = try store.add(owner: 1000, NewItem(service: "svc", account: "acct"), secret: secret("v1"), audit: record())
        let read = try #require(try reader.releaseRow(owner: 1000, service: "svc", account: "acct"))
        var released: [String] = []
        var replaced: StoredItem?
        #expect(store.groupTransaction {
            _ = try? store.memberTransaction { () throws(StoreError) in
                _ = try store.replace(first, with: NewItem(service: "svc", account: "acct"), secret: secret("v2"), audit: record(.update))
                throw StoreError.conflict  // fails after its change: rolled back
            }
            if let opened = try? store.memberTransaction({ () throws(StoreError) in try store.openConfirmed(read, opened: nil, appPassword: nil) }) {
                released.append("\(string(opened.secret))@\(opened.current.generation)")
            }
            replaced = try? store.memberTransaction { () throws(StoreError) in
                try store.replace(first, with: NewItem(service: "svc", account: "acct"), secret: secret("v3"), audit: record(.update))
            }
            if let opened = try? store.memberTransaction({ () throws(StoreError) in try store.openConfirmed(read, opened: nil, appPassword: nil) }) {
                released.append("\(string(opened.secret))@\(opened.current.generation)")
            }
        })
        #expect(replaced?.generation == 2)
        #expect(released == ["v1@1", "v3@2"])
        store.close()
        let reopened = try openStore(dir)
        #expect(try reopened.verifyAudit() == .intact(count: 2))
        let item = try #require(try reopened.item(owner: 1000, service: "svc", account: "acct"))
        #expect(item.generation == 2)
        try expectSecret(string(reopened.openSecret(item)), equals: "v3")
    }
}
