import Foundation
import Testing
import KeyholdCore
import KeyholdVault
import KeyholdTestSupport

/// Inside a group commit, plain audit entries leave the head row to the group's end
/// (`HeadDeferral`). What is committed must be exactly what moving the head per entry gave: the
/// head on the newest entry, an intact chain, a generation record that verifies after a
/// restart; members that fail take their entries back; a log that has an entry beyond its head
/// (written while the vault was closed) is never chained onto; a prune in the group works on
/// the true head. Real SQLite files.
@Suite struct GroupHeadTests {
    static let auditColumns = "seq, time_us, caller_uid, caller_pid, executable, operation, item_id, details, decision, method, outcome, entry_tag, mac"

    /// The head row and the newest entry, as committed (a connection of the test's own).
    static func headAndNewest(_ dir: TempDir) throws -> (head: [[UInt8]], newest: [[UInt8]]) {
        let db = try Database(path: dir.state + "/vault.db")
        defer { db.close() }
        func row(_ sql: String) throws -> [[UInt8]] {
            try db.withStatement(sql) { (s) throws(DatabaseError) in
                try s.step() ? [Array(String(s.int64(0)).utf8), s.blob(1)] : []
            }
        }
        return (try row("SELECT seq, mac FROM audit_head WHERE id = 1"), try row("SELECT seq, mac FROM audit ORDER BY seq DESC LIMIT 1"))
    }

    static func append(_ store: VaultStore, _ reason: String, fail: Bool = false) -> Bool {
        (try? store.memberTransaction { () throws(StoreError) -> Void in
            try store.append(record(.get, reason: reason))
            if fail { throw StoreError.conflict }  // this member's own failure: its entry goes with it
        }) != nil
    }

    @Test func aGroupOfMixedMembersLeavesTheHeadOnItsNewestEntryAndAnIntactChain() throws {
        let dir = TempDir()
        let store = try openStore(dir)
        let first = try store.add(owner: 1000, NewItem(service: "svc", account: "acct"), secret: secret("v1"), audit: record())
        var acknowledged: [Bool] = []
        let committed = store.groupTransaction {
            for i in 0..<3 { acknowledged.append(Self.append(store, "a\(i)")) }
            acknowledged.append((try? store.memberTransaction { () throws(StoreError) -> Void in
                _ = try store.replace(first, with: NewItem(service: "svc", account: "acct"), secret: secret("v2"), audit: record(.update))
            }) != nil)
            for i in 0..<2 { acknowledged.append(Self.append(store, "b\(i)")) }
            acknowledged.append(Self.append(store, "undone", fail: true))
            acknowledged.append(Self.append(store, "c"))
            acknowledged.append(Self.append(store, "undone-last", fail: true))
        }
        #expect(committed)
        #expect(acknowledged == [true, true, true, true, true, true, false, true, false])
        let (head, newest) = try Self.headAndNewest(dir)
        #expect(!head.isEmpty && head == newest)
        store.close()
        let reopened = try openStore(dir)
        #expect(try reopened.verifyAudit() == .intact(count: 8))
        let item = try #require(try reopened.item(owner: 1000, service: "svc", account: "acct"))
        #expect(item.generation == 2)
        try expectSecret(string(reopened.openSecret(item)), equals: "v2")
        #expect(try reopened.auditEntries(visibleTo: nil).compactMap(\.readable.reason).filter { $0.hasPrefix("undone") }.isEmpty)
    }

    /// Someone who could write vault.db while the vault was closed appended an entry beyond the
    /// head (copied from the newest, renumbered; they have no key for a new MAC). A group's
    /// entries are not chained onto it: none is acknowledged (the writes fail on that number,
    /// as outside a group), and verify still names that entry.
    @Test func anEntryBeyondTheHeadIsNeverChainedOnto() throws {
        let dir = TempDir()
        var store = try openStore(dir)
        for i in 0..<3 { try store.append(record(.get, reason: "before-\(i)")) }
        store.close()
        let db = try Database(path: dir.state + "/vault.db")
        try db.execute("INSERT INTO audit (\(Self.auditColumns)) SELECT seq + 1, \(Self.auditColumns.dropFirst(5)) FROM audit ORDER BY seq DESC LIMIT 1")
        db.close()
        store = try openStore(dir)
        var acknowledged: [Bool] = []
        _ = store.groupTransaction {
            for i in 0..<3 { acknowledged.append(Self.append(store, "after-\(i)")) }
        }
        #expect(acknowledged == [false, false, false])
        let verified = try store.verifyAudit()
        guard case .broken(seq: 4, _) = verified else { Issue.record("verify: \(verified)"); return }
        store.close()
    }

    /// A prune through the group's own newest entry (a number only the writer sees before the
    /// commit), between plain entries: the chain goes on from the checkpoint it leaves.
    @Test func aPruneThroughTheGroupsNewestEntryKeepsTheChainIntact() throws {
        let dir = TempDir()
        let store = try openStore(dir)
        for i in 0..<2 { try store.append(record(.get, reason: "old-\(i)")) }
        var acknowledged: [Bool] = []
        let committed = store.groupTransaction {
            for i in 0..<2 { acknowledged.append(Self.append(store, "in-group-\(i)")) }
            acknowledged.append((try? store.memberTransaction { () throws(StoreError) -> Void in
                try store.pruneAudit(throughSeq: 4, audit: record(.auditPrune))
            }) != nil)
            acknowledged.append(Self.append(store, "after-prune"))
        }
        #expect(committed)
        #expect(acknowledged == [true, true, true, true])
        #expect(try store.verifyAudit() == .intact(count: 2))
        let (head, newest) = try Self.headAndNewest(dir)
        #expect(head == newest && head.first == Array("6".utf8))
        store.close()
        #expect(try openStore(dir).verifyAudit() == .intact(count: 2))
    }
}
