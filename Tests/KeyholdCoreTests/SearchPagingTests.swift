import Foundation
@testable import KeyholdCore
@testable import KeyholdVault
import Testing

/// A search read page by page (the broker releases the store between pages, so a search that
/// matches or scans every item never holds up other callers for its whole length): the pages
/// together are exactly the items a filter of the whole listing gives, in creation order, and
/// no page reads more than its limit of rows, whichever way the query is driven.
@Suite struct SearchPagingTests {
    /// Every page of `query` at `limit` (bounded, so a cursor that never ends fails the test).
    static func pages(_ store: VaultStore, _ query: [String: String], limit: Int) throws -> [[StoredItem]] {
        var pages: [[StoredItem]] = []
        var cursor: VaultStore.ItemPageCursor?
        repeat {
            let page = try store.search(owner: 1000, attributes: query, after: cursor, limit: limit)
            #expect(page.damaged == 0)
            pages.append(page.items)
            cursor = page.next
        } while cursor != nil && pages.count < 1_000
        #expect(cursor == nil, "the pages did not end")
        return pages
    }

    @Test func pagesTogetherAreTheMatchingItemsAndEachReadsAtMostItsLimit() throws {
        let dir = TempDir()
        let store = try openStore(dir)
        // More items per common pair than the count that makes a pair rare (256).
        for i in 0..<300 {
            try store.add(owner: 1000, NewItem(service: "mail", account: "ss:application=app&user=u\(i % 3)&n=\(i)"),
                          secret: secret("s"), audit: record())
        }
        for i in 0..<260 {
            try store.add(owner: 1000, NewItem(service: "mail", account: "ss:application=other&group=g&n=\(i)"),
                          secret: secret("s"), audit: record())
        }
        for i in 0..<2 {
            try store.add(owner: 1000, NewItem(service: "chat", account: "ss:application=rare&user=u0&n=\(i)"),
                          secret: secret("s"), audit: record())
        }
        // Another owner's items with the same names are never part of the answer.
        try store.add(owner: 1001, NewItem(service: "mail", account: "ss:application=app&user=u1&n=0"), secret: secret("s"), audit: record(uid: 1001))
        let all = try store.items(owner: 1000).items
        #expect(all.count == 562)

        let queries: [(query: [String: String], matches: Int)] = [
            (["application": "app"], 300),                  // one common pair
            (["application": "app", "user": "u1"], 100),    // two common pairs
            (["application": "other", "group": "g"], 260),  // two common pairs, every row of one
            (["application": "app", "group": "g"], 0),      // two common pairs that never meet
            (["application": "rare"], 2),                   // a rare pair drives
            (["user": "u0", "service": "chat"], 2),         // a rare pair with a common one
            (["application": "app", "service": "chat"], 0), // rare, but not with the other
            (["user": "nobody"], 0),                        // no index row at all
        ]
        for (query, matches) in queries {
            let expected = all.filter { AttributeMap.matches(AttributeMap.attributes(service: $0.service, account: $0.account), query) }.map(\.id)
            #expect(expected.count == matches, "\(query)")
            for limit in [7, 500] {
                let pages = try Self.pages(store, query, limit: limit)
                #expect(pages.flatMap { $0 }.map(\.id) == expected, "\(query) at \(limit)")
                #expect(pages.allSatisfy { $0.count <= limit })
            }
            #expect(try store.search(owner: 1000, attributes: query).items.map(\.id) == expected, "\(query)")
        }
        // Common pairs that never meet: the walk over the owner's items still ends page by page,
        // one page per `limit` rows read (562 rows at 7 a page: 81 pages), never all at once.
        #expect(try Self.pages(store, ["application": "app", "group": "g"], limit: 7).count == 81)
        // A rare pair reads only its own rows: one page.
        #expect(try Self.pages(store, ["application": "rare"], limit: 7).count == 1)
    }
}
