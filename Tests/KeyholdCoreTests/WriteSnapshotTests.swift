import Foundation
import Testing
@testable import KeyholdCore
@testable import KeyholdVault
import KeyholdTestSupport

/// Writes undone inside a group commit (a member that fails, a prune) leave later members of
/// the same write transaction reading what is really stored. Each test undoes writes between
/// two members and checks that what is committed is exactly right: an intact chain, the right
/// generation, the right secret released. Real SQLite files.
@Suite struct WriteSnapshotTests {
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
        let first = try store.add(owner: 1000, NewItem(service: "svc", account: "acct"), secret: secret("v1"), audit: record())
        var released: [String] = []
        var replaced: StoredItem?
        #expect(store.groupTransaction {
            _ = try? store.memberTransaction { () throws(StoreError) in
                _ = try store.replace(first, with: NewItem(service: "svc", account: "acct"), secret: secret("v2"), audit: record(.update))
                throw StoreError.conflict  // fails after its change: rolled back
            }
            if let opened = try? store.memberTransaction({ () throws(StoreError) in try store.openCurrentSecret(first) }) {
                released.append("\(string(opened.secret))@\(opened.current.generation)")
            }
            replaced = try? store.memberTransaction { () throws(StoreError) in
                try store.replace(first, with: NewItem(service: "svc", account: "acct"), secret: secret("v3"), audit: record(.update))
            }
            if let opened = try? store.memberTransaction({ () throws(StoreError) in try store.openCurrentSecret(first) }) {
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
