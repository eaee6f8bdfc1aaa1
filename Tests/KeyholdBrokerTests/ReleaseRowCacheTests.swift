import Foundation
import Glibc
import Synchronization
import Testing
import KeyholdCore
import KeyholdVault
import KeyholdProtocol
import KeyholdTestSupport
@testable import KeyholdBroker

/// The rows the event loop's workers decide a `get` on are kept between requests
/// (ReleaseRowCache.swift) while the writer commits no change to any item. Against a real
/// vault file in a real `Broker`, through the worker's own entry points (`Session.forWorker`,
/// `getWithoutWaiting`): a change the writer committed is seen by every lookup that starts after
/// it, also while other threads keep filling the cache; and a row changed on disk by another
/// connection, which the cache cannot see, is never released from it.
@Suite(.serialized, .timeLimit(.minutes(3))) struct ReleaseRowCacheTests {
    typealias Harness = ReaderLookupTests.Harness

    /// The row a worker would decide on for `svc`/`acct`, nil when it leaves the request to a thread.
    static func workerRow(_ h: Harness) -> ReleaseRow? {
        guard case .get(_, let row)? = h.session().forWorker(ClientMessage.request(Request(.get, item: Harness.ref)).encode(),
                                                              senderUIDs: []) else { return nil }
        return row
    }

    /// A worker's `get` of `row`, committed (the group commit runs on this thread: no event loop;
    /// a failed release's denial, which the loop hands to a thread, is audited here too).
    static func workerGet(_ h: Harness, _ row: ReleaseRow) -> Response? {
        final class Answer: @unchecked Sendable { var response: Response? }  // written before `done` is signalled
        let answer = Answer()
        let done = DispatchSemaphore(value: 0)
        h.session().getWithoutWaiting(Request(.get, item: Harness.ref), found: row, offload: { body in body() }, then: { response in
            answer.response = response
            done.signal()
        })
        guard done.wait(timeout: .now() + 30) == .success else { return nil }
        return answer.response
    }

    @Test func everyChangeTheWriterCommitsIsSeenByTheNextLookup() throws {
        let h = try Harness()
        let first = try #require(h.add("s1"))
        #expect(Self.workerRow(h)?.item.generation == 1)
        #expect(h.broker.releaseRows.count == 1)  // kept
        #expect(Self.workerRow(h)?.item.id == first.id)

        let second = h.replace(first, "s2")
        #expect(Self.workerRow(h)?.item.generation == second?.generation)
        let secret = try #require(Self.workerRow(h).flatMap { Self.workerGet(h, $0) }?.secret)
        expectSecret(secret.withUnsafeBytes { Array($0) }, equals: Array("s2".utf8))

        // Removed: no row for a worker (a thread answers "not found"); put back: the new item.
        let removed: Bool = h.broker.withStore { store in (try? store.delete(try #require(second), audit: Harness.record(.delete))) != nil }
        #expect(removed)
        #expect(Self.workerRow(h)?.item.generation == nil)
        let third = try #require(h.add("s3"))
        #expect(Self.workerRow(h)?.item.id == third.id)

        // Tightened: the worker declines it (a thread asks for the person).
        _ = h.replace(third, "s4", policy: "device-passcode")
        #expect(Self.workerRow(h)?.item.generation == nil)
    }

    /// Rows are kept per owner: another user asking for the same names finds nothing of the
    /// owner's, before or after the owner's row is kept.
    @Test func anotherUsersLookupOfTheSameNamesNeverGetsAKeptRow() throws {
        let h = try Harness()
        _ = try #require(h.add("owner-only"))
        let other = Caller(uid: ReleaseGateTests.uid + 1, pid: getpid(), executable: "/t", sessionID: 77, startTime: 4242,
                           userName: "other", tty: nil, remoteHost: nil)
        let ask = ClientMessage.request(Request(.get, item: Harness.ref))
        #expect(Session(fd: -1, caller: other, broker: h.broker).forWorker(ask.encode(), senderUIDs: []) == nil)
        #expect(Self.workerRow(h)?.item.owner == ReleaseGateTests.uid)  // kept now
        #expect(Session(fd: -1, caller: other, broker: h.broker).forWorker(ask.encode(), senderUIDs: []) == nil)
    }

    /// However many rows are looked up, at most `maxRows` are kept, and never more than
    /// `maxBytes` of sealed boxes (rows of 64 KiB secrets here).
    @Test func whatIsKeptStaysWithinItsBounds() throws {
        let h = try Harness()
        _ = try #require(h.add("small"))
        let small = try #require(Self.workerRow(h))
        let cache = ReleaseRowCache(version: h.broker.withStore { $0.itemRowsVersion })
        for i in 0..<(ReleaseRowCache.maxRows + 100) {
            _ = cache.row(owner: ReleaseGateTests.uid, ItemReference(service: "svc-\(i)", account: "a")) { .success(small) }
            #expect(cache.count <= ReleaseRowCache.maxRows)
        }
        let big: StoredItem? = h.broker.withStore { store in
            try? store.add(owner: ReleaseGateTests.uid, NewItem(service: "big", account: "acct"),
                           secret: SecureBytes(count: Limits.maxSecretBytes), audit: Harness.record(.put))
        }
        #expect(big != nil)
        let bigRow = try #require(try h.broker.readReleaseRow(owner: ReleaseGateTests.uid, ItemReference(service: "big", account: "acct"))?.get())
        let cap = ReleaseRowCache.maxBytes / bigRow.sealedByteCount
        for i in 0..<(cap + 20) {
            _ = cache.row(owner: ReleaseGateTests.uid, ItemReference(service: "big-\(i)", account: "a")) { .success(bigRow) }
            #expect(cache.count <= cap)
        }
    }

    /// One thread replaces the item 150 times through the writer; three others look it up as
    /// workers do, as fast as they can, so the cache is filled between every two changes. No
    /// lookup may return a generation older than the last replace that had returned before the
    /// lookup started. (A cache that ignores the version fails this at once: generation 1 after
    /// 2 was committed.)
    @Test func noLookupReturnsARowOlderThanAChangeCommittedBeforeItStarted() throws {
        let h = try Harness()
        var item = try #require(h.add("v"))
        let committed = Atomic<UInt64>(item.generation)
        let finished = Atomic<Bool>(false)
        let stale = Mutex<[String]>([])
        let lookups = Atomic<Int>(0)
        let group = DispatchGroup()
        for _ in 0..<3 {
            group.enter()
            Thread {
                defer { group.leave() }
                while !finished.load(ordering: .acquiring) {
                    let before = committed.load(ordering: .acquiring)
                    guard let row = Self.workerRow(h) else {
                        stale.withLock { $0.append("no row after generation \(before)") }
                        continue
                    }
                    lookups.add(1, ordering: .relaxed)
                    if row.item.generation < before {
                        stale.withLock { $0.append("generation \(row.item.generation) after \(before) was committed") }
                    }
                }
            }.start()
        }
        for i in 0..<150 {
            let next = h.replace(item, "v\(i)")
            guard let next else { Issue.record("replace \(i) failed"); break }
            item = next
            committed.store(next.generation, ordering: .releasing)
        }
        finished.store(true, ordering: .releasing)
        #expect(group.wait(timeout: .now() + 60) == .success)
        #expect(stale.withLock { $0 }.isEmpty, "\(stale.withLock { $0.prefix(5) })")
        #expect(lookups.load(ordering: .relaxed) > 150)
        #expect(Self.workerRow(h)?.item.generation == item.generation)
    }

    /// Another connection changes the kept row on disk (someone who can write vault.db): the
    /// cache still holds the row it read, but nothing is released from it: the writer, which
    /// reads the stored row before any release, refuses with *integrity*. A flipped byte of the
    /// sealed secret, and an older copy of the row put back.
    @Test func aKeptRowChangedOnDiskByAnotherConnectionIsNeverReleased() throws {
        for tamper in ["flip", "older"] {
            let h = try Harness()
            let first = try #require(h.add("old"))
            try h.sql("VACUUM INTO '\(h.directory)/snapshot.db'")
            let replaced = h.replace(first, "new")
            let kept = try #require(Self.workerRow(h))
            #expect(kept.item.generation == replaced?.generation)

            if tamper == "flip" {
                let db = try Database(path: h.dbPath)
                defer { db.close() }
                var sealed: [UInt8] = try db.withStatement("SELECT secret FROM items") { (s) throws(DatabaseError) in
                    _ = try s.step(); return s.blob(0)
                }
                sealed[sealed.count / 2] ^= 0x01
                try db.withStatement("UPDATE items SET secret = ?1") { (s) throws(DatabaseError) in
                    try s.bind(1, blob: sealed); _ = try s.step()
                }
            } else {
                try h.sql("ATTACH '\(h.directory)/snapshot.db' AS old; DELETE FROM items; INSERT INTO items SELECT * FROM old.items;")
            }
            let decided = try #require(Self.workerRow(h), "\(tamper)")
            #expect(decided.item.generation == kept.item.generation, "\(tamper): the kept row is what the worker decides on")
            let response = try #require(Self.workerGet(h, decided), "\(tamper)")
            #expect(response.outcome == .integrityFailure, "\(tamper): \(response.outcome)")
            #expect(response.secret == nil, "\(tamper)")
        }
    }
}
