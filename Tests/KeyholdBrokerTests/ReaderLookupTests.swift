import Foundation
import Glibc
import Synchronization
import Testing
import KeyholdCore
import KeyholdVault
import KeyholdProtocol
import KeyholdTestSupport
@testable import KeyholdBroker

/// The long reads run on a read-only connection (`VaultReader`), against a real vault file,
/// inside a real `Broker`: they do not wait for the store lock, the reader opens only the
/// writer's file, it checks rows as the writer does, and it answers nothing after a rollback.
@Suite(.serialized, .timeLimit(.minutes(3))) struct ReaderLookupTests {
    final class Harness: @unchecked Sendable {
        let directory = TestPaths.temporaryDirectory("kh-reader")
        let broker: Broker
        var dbPath: String { directory + "/state/vault.db" }
        static let ref = ItemReference(service: "svc", account: "acct")

        init(anchored: Bool = false) throws {
            let store = try VaultStore.open(stateDirectory: directory + "/state", passwordHashing: .interactive)
            broker = Broker(store: store, gate: ReleaseGateTests.gate(ReleaseGateTests.yes),
                            syslog: AuditSyslog(socketPath: directory + "/no-log"),
                            reserve: FreeSpaceReserve(directory: directory, bytes: 0),
                            anchor: anchored ? RollbackAnchor(path: directory + "/anchor") : nil)
        }
        deinit {
            broker.close()
            try? FileManager.default.removeItem(atPath: directory)
        }

        func session() -> Session { Session(fd: -1, caller: ReleaseGateTests.caller(), broker: broker) }

        /// The item as the long-read reader lists it; *integrity* when its row is listed as damaged.
        func listed() -> Result<StoredItem?, Denial> {
            broker.longRead { (source) throws(StoreError) in try source.items(owner: ReleaseGateTests.uid, after: nil, limit: 10) }
                .flatMap { page in page.damaged > 0 ? .failure(Denial(.integrityFailure)) : .success(page.items.first) }
        }

        static func record(_ op: AuditOperation) -> AuditRecord {
            AuditRecord(callerUID: ReleaseGateTests.uid, callerPID: 1, executable: "/t", operation: op, service: "svc",
                        account: "acct", decision: .granted, method: .none, reason: nil, outcome: .ok)
        }

        /// Through the store lock, as the broker's `put` does.
        func add(_ secret: String) -> StoredItem? {
            broker.withStore { store in
                try? store.add(owner: ReleaseGateTests.uid, NewItem(service: "svc", account: "acct"),
                               secret: SecureBytes(copying: Array(secret.utf8)), audit: Self.record(.put))
            }
        }

        /// Replaces `item` through the store lock, as the broker's `put --update` does.
        func replace(_ item: StoredItem, _ secret: String, policy: String = "none") -> StoredItem? {
            broker.withStore { store in
                try? store.replace(item, with: NewItem(service: "svc", account: "acct", access: AccessControl(policy: try! Policy(parsing: policy))),
                                   secret: SecureBytes(copying: Array(secret.utf8)), audit: Self.record(.update))
            }
        }

        /// SQL on a connection of the test's own (someone who can write vault.db).
        func sql(_ text: String) throws {
            let db = try Database(path: dbPath)
            defer { db.close() }
            try db.execute(text)
        }
    }

    /// Runs `body` while another thread holds the store lock (as a group commit does across its
    /// fsync); the holder lets go once `body` answered, or after 30 s. Returns `body`'s answer
    /// and whether it came while the lock was held.
    static func whileAnotherThreadHoldsTheStore<R>(_ h: Harness, _ body: () -> R) -> (R, answeredWhileHeld: Bool) {
        whileAnotherThreadHolds({ inside in h.broker.withStore { _ in inside() } }, body)
    }

    /// Runs `body` while another thread is inside `hold` (it calls its argument while holding
    /// what it holds), which returns once `body` answered, or after 30 s. Returns `body`'s
    /// answer and whether it came while `hold` held.
    static func whileAnotherThreadHolds<R>(_ hold: @escaping @Sendable (() -> Void) -> Void,
                                           _ body: () -> R) -> (R, answeredWhileHeld: Bool) {
        let held = DispatchSemaphore(value: 0), answered = DispatchSemaphore(value: 0), released = DispatchSemaphore(value: 0)
        let answeredWhileHeld = Mutex(false)
        let holder = Thread {
            hold {
                held.signal()
                let ok = answered.wait(timeout: .now() + 30) == .success
                answeredWhileHeld.withLock { $0 = ok }
            }
            released.signal()
        }
        holder.start()
        held.wait()
        let result = body()
        answered.signal()
        released.wait()
        return (result, answeredWhileHeld.withLock { $0 })
    }

    static func found(_ r: Result<StoredItem?, Denial>) -> StoredItem? {
        if case .success(let item?) = r { return item }
        return nil
    }


    static func outcome(_ r: Result<StoredItem?, Denial>) -> Outcome {
        switch r {
        case .success(nil): .notFound
        case .success: .ok
        case .failure(let d): d.outcome
        }
    }

    /// The files at the vault's paths are others than the writer's: no reader opens them. A
    /// reader opened before keeps the writer's files (the WAL included, which SQLite opens by
    /// path at the first read, so that read is part of the open). A broker whose readers are
    /// refused answers lookups from the writer, which still has the real files.
    @Test func aReaderRefusesFilesThatAreNotTheWritersFiles() throws {
        let dir = TestPaths.temporaryDirectory("kh-reader-swap")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let state = dir + "/state", path = dir + "/state/vault.db"
        let writer = try VaultStore.open(stateDirectory: state, passwordHashing: .interactive)
        func add() throws -> StoredItem {
            try writer.add(owner: ReleaseGateTests.uid, NewItem(service: "svc", account: "acct"),
                           secret: SecureBytes(copying: Array("s".utf8)), audit: Harness.record(.put))
        }
        let item = try add()
        #expect(runCommand("/bin/cp", ["-a", state, dir + "/snapshot"]).status == 0)  // holds the item
        try writer.delete(item, audit: Harness.record(.delete))

        // The state directory swapped for the older copy under an open reader: it reads the writer's files.
        let reader = try VaultReader.open(for: writer)
        #expect(rename(state, dir + "/live") == 0 && rename(dir + "/snapshot", state) == 0)
        #expect(try reader.items(owner: ReleaseGateTests.uid, after: nil, limit: 10).items.isEmpty)
        reader.close()
        #expect(throws: StoreError.integrity) { try VaultReader.open(for: writer) }
        #expect(rename(state, dir + "/copy") == 0 && rename(dir + "/live", state) == 0)
        try VaultReader.open(for: writer).close()

        // Another file at the database's path, at the WAL's, or a symlink to the real database.
        for file in [path, path + "-wal"] {
            #expect(rename(file, file + ".real") == 0)
            #expect(runCommand("/bin/cp", ["-p", file + ".real", file]).status == 0)
            #expect(throws: StoreError.integrity) { try VaultReader.open(for: writer) }
            #expect(rename(file + ".real", file) == 0)
        }
        try VaultReader.open(for: writer).close()
        #expect(rename(path, path + ".real") == 0 && symlink(path + ".real", path) == 0)
        #expect(throws: StoreError.integrity) { try VaultReader.open(for: writer) }

        // A broker started on that writer while the path is not its file: no readers, and the
        // writer answers the lookup.
        _ = try add()
        let broker = Broker(store: writer, gate: ReleaseGateTests.gate(ReleaseGateTests.yes),
                            syslog: AuditSyslog(socketPath: dir + "/no-log"), reserve: FreeSpaceReserve(directory: dir, bytes: 0))
        let page = broker.longRead { (source) throws(StoreError) in try source.items(owner: ReleaseGateTests.uid, after: nil, limit: 10) }
        #expect((try? page.get())?.items.count == 1)
        broker.close()
    }

    /// The reader checks a row against the authenticated generation record as the writer does:
    /// an older copy of a row put back (with or without its old `item_generation` row) is
    /// *integrity* on both connections, never the older item.
    @Test func anOlderRowPutBackIsIntegrityOnTheReaderAsOnTheWriter() throws {
        let h = try Harness()
        let first = try #require(h.add("old"))
        try h.sql("VACUUM INTO '\(h.directory)/snapshot.db'")
        let replaced = h.replace(first, "new")
        #expect(replaced?.generation == 2)
        #expect(Self.found(h.listed())?.generation == 2)  // the reader's record is cached now

        let attach = "ATTACH '\(h.directory)/snapshot.db' AS old;"
        try h.sql(attach + "DELETE FROM items; INSERT INTO items SELECT * FROM old.items;")
        #expect(Self.outcome(h.listed()) == .integrityFailure)
        #expect(Self.outcome(h.session().lookup(Harness.ref)) == .integrityFailure)
        try h.sql(attach + "DELETE FROM item_generation; INSERT INTO item_generation SELECT * FROM old.item_generation;")
        #expect(Self.outcome(h.listed()) == .integrityFailure)
        #expect(Self.outcome(h.session().lookup(Harness.ref)) == .integrityFailure)
    }

    /// A change the writer published and then rolled back (its group member failed after it)
    /// is not adopted by a reader whose own record is stale: the stored digest is not the
    /// published one, so the reader reads the whole record and finds the row at the
    /// generation that was kept (adopting it would make the row look older: integrity).
    @Test func aReaderDoesNotAdoptARecordWhoseChangeWasRolledBack() throws {
        let h = try Harness()
        let first = try #require(h.add("v1"))
        #expect(Self.found(h.listed())?.generation == 1)  // cached by the reader
        let second = h.replace(first, "v2")
        let kept = try #require(second)
        h.broker.withStore { store in
            _ = store.groupTransaction {
                _ = try? store.memberTransaction { () throws(StoreError) in
                    try store.replace(kept, with: NewItem(service: "svc", account: "acct"),
                                      secret: SecureBytes(copying: Array("v3".utf8)), audit: Harness.record(.update))
                    throw StoreError.conflict  // the member fails after its change: rolled back
                }
            }
        }
        let seen = h.listed()
        #expect(Self.outcome(seen) == .ok && Self.found(seen)?.generation == 2, "\(Self.outcome(seen))")
        #expect(Self.found(h.session().lookup(Harness.ref))?.generation == 2)  // the writer agrees
    }

    /// A whole older copy put back into the live file (rows, generation record and audit head:
    /// every check of the row passes, and the reader does find the removed item). The release
    /// goes through the store lock, where the rollback watch sees the head behind the anchor:
    /// nothing is released, every later answer is the rollback refusal, and the reader answers
    /// nothing from the vault any more (the closed store's answer, as the writer path gives).
    @Test func afterARollbackNoGetIsServedAndTheReaderAnswersNothing() throws {
        let h = try Harness(anchored: true)
        let item = try #require(h.add("revoked-token"))
        try h.sql("VACUUM INTO '\(h.directory)/snapshot.db'")
        let removed: Bool = h.broker.withStore { store in (try? store.delete(item, audit: Harness.record(.delete))) != nil }
        #expect(removed)
        #expect(Self.outcome(h.listed()) == .notFound)

        try h.sql(restoreVaultRowsSQL(from: "\(h.directory)/snapshot.db"))
        #expect(Self.found(h.listed())?.id == item.id)  // the reader reads what the file holds

        var request = Request(.get, item: Harness.ref)
        request.allowInteraction = false
        let response = h.session().get(request)
        #expect(response.secret == nil)
        #expect(response.outcome != .ok)
        #expect(h.broker.rollbackRefusal.withLock { $0 } != nil)
        #expect(h.broker.rollbackAnswer(replacing: response)?.outcome == .integrityFailure)

        let viaReader = h.listed()
        #expect(Self.outcome(viaReader) == .otherError)
        #expect(Self.outcome(viaReader) == Self.outcome(h.session().lookup(Harness.ref)))
        #expect(h.session().get(request).secret == nil)
        // Nor does the long-read reader list the restored item.
        let page = h.broker.longRead { (source) throws(StoreError) in try source.items(owner: ReleaseGateTests.uid, after: nil, limit: 10) }
        guard case .failure(let denial) = page else { Issue.record("a page was read after the rollback"); return }
        #expect(denial.outcome == .otherError)
        // Nor does an audit verify.
        let verified = h.broker.longRead { (source) throws(StoreError) in try source.verifyAudit(visibleTo: nil) }
        guard case .failure(let refused) = verified else { Issue.record("the audit was verified after the rollback"); return }
        #expect(refused.outcome == .otherError)
    }

    /// The reads a caller can make long (pages of `list`, `search` and `audit`, and `audit
    /// verify`) run on the long-read reader: they are answered while one thread holds the store
    /// lock (as a group commit does across its fsync), so they and releases never wait for each
    /// other. Without that reader they wait for the lock, the holder gives up after 30 s, and
    /// this fails.
    @Test func longReadsAreAnsweredWhileTheStoreLockIsHeld() throws {
        let h = try Harness()
        let item = try #require(h.add("s1"))
        let uid = ReleaseGateTests.uid
        let (answers, answeredWhileHeld) = Self.whileAnotherThreadHoldsTheStore(h) {
            (listed: h.broker.longRead { (source) throws(StoreError) in try source.items(owner: uid, after: nil, limit: 500).items.map(\.id) },
             found: h.broker.longRead { (source) throws(StoreError) in
                try source.search(owner: uid, attributes: ["service": "svc"], after: nil, limit: 500).items.map(\.id)
             },
             entries: h.broker.longRead { (source) throws(StoreError) in
                try source.auditEntries(visibleTo: uid, since: nil, item: nil, afterSeq: nil, ownAfter: nil, limit: 10).map(\.readable.operation)
             },
             verified: h.broker.longRead { (source) throws(StoreError) in try source.verifyAudit(visibleTo: nil).verification })
        }
        let (listed, found) = (answers.listed, answers.found)
        #expect((try? answers.entries.get()) == ["put"])
        #expect((try? answers.verified.get()) == .intact(count: 1))
        #expect(answeredWhileHeld)
        #expect((try? listed.get()) == [item.id])
        #expect((try? found.get()) == [item.id])
    }
}
