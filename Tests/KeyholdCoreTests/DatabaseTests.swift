import Foundation
@testable import KeyholdCore
@testable import KeyholdVault
import Testing

@Suite struct DatabaseTests {
    @Test func bindStepColumnAndTransactions() throws {
        let dir = TempDir()
        let db = try Database(path: dir.path + "/t.db", create: true)
        #expect(try db.pragma("journal_mode=WAL") == "wal")
        try db.execute("CREATE TABLE t (k TEXT PRIMARY KEY, b BLOB, n INTEGER)")
        let blob: [UInt8] = [0, 1, 0, 255, 0]
        try db.withStatement("INSERT INTO t VALUES (?1, ?2, ?3)") { (s) throws(DatabaseError) in
            try s.bind(1, text: "a\u{0}b")
            try s.bind(2, blob: blob)
            try s.bind(3, Int64.min)
            try s.step()
        }
        let row = try db.withStatement("SELECT k, b, n FROM t") { (s) throws(DatabaseError) in
            try s.step() ? (s.text(0), s.blob(1), s.int64(2)) : nil
        }
        #expect(row?.0 == "a\u{0}b")  // text with an embedded NUL is kept whole
        #expect(row?.1 == blob)
        #expect(row?.2 == Int64.min)

        // A unique violation has its extended code.
        #expect {
            try db.withStatement("INSERT INTO t VALUES (?1, NULL, 0)") { (s) throws(DatabaseError) in
                try s.bind(1, text: "a\u{0}b")
                try s.step()
            }
        } throws: { ($0 as? DatabaseError)?.isUniqueViolation == true }

        // A throwing body rolls back.
        struct Boom: Error {}
        #expect(throws: Boom.self) {
            try db.transaction(mapError: { $0 as Error }) { () throws(any Error) in
                try db.execute("INSERT INTO t VALUES ('x', NULL, 1)")
                throw Boom()
            }
        }
        let count = try db.withStatement("SELECT count(*) FROM t") { (s) throws(DatabaseError) in try s.step() ? s.int64(0) : -1 }
        #expect(count == 1)

        // A bad statement is a typed error, not a crash.
        #expect(throws: DatabaseError.self) { try db.execute("SELEC nothing") }
        db.close()
        #expect(throws: DatabaseError.self) { try db.execute("SELECT 1") }
    }

    /// The version of a watched table's rows (the broker keeps looked-up rows while it has not
    /// moved): odd from the first change of a row until its transaction ends, even and moved
    /// once it committed or rolled back, also for a change made outside a transaction; other
    /// tables do not move it. A release's audit entry (the store's append) leaves the items'
    /// version where it was; putting, replacing and deleting an item move it.
    @Test func watchedRowsVersionMovesWithEveryChangeAndIsOddWhileOneIsUncommitted() throws {
        let dir = TempDir()
        let db = try Database(path: dir.path + "/t.db", create: true)
        try db.execute("CREATE TABLE items (k INTEGER PRIMARY KEY, v TEXT); CREATE TABLE other (k INTEGER PRIMARY KEY)")
        let version = try db.watchRows(of: "items")
        let start = version.current
        #expect(start % 2 == 0)

        try db.transaction { () throws(DatabaseError) in
            try db.execute("INSERT INTO other VALUES (1)")
            #expect(version.current == start)  // another table
            try db.execute("INSERT INTO items VALUES (1, 'a')")
            #expect(version.current % 2 == 1)  // uncommitted
            try db.execute("UPDATE items SET v = 'b' WHERE k = 1")
            #expect(version.current % 2 == 1)
        }
        let committed = version.current
        #expect(committed % 2 == 0 && committed > start)

        struct Undone: Error {}
        #expect(throws: Undone.self) {
            try db.transaction(mapError: { $0 as Error }) { () throws(any Error) in
                try db.execute("DELETE FROM items WHERE k = 1")
                #expect(version.current % 2 == 1)
                throw Undone()
            }
        }
        let rolledBack = version.current
        #expect(rolledBack % 2 == 0 && rolledBack > committed)

        try db.execute("INSERT INTO items VALUES (2, 'c')")  // outside a transaction: its own commit
        let autocommitted = version.current
        #expect(autocommitted % 2 == 0 && autocommitted > rolledBack)
        try db.withStatement("DELETE FROM items WHERE k = ?1") { (s) throws(DatabaseError) in
            try s.bind(1, Int64(2))
            _ = try s.step()
        }
        #expect(version.current % 2 == 0 && version.current > autocommitted)

        let unchanged = version.current
        try db.execute("INSERT INTO other VALUES (2)")
        try db.execute("SELECT * FROM items")
        #expect(version.current == unchanged)

        // Through the store: a release's entry does not move it, item changes do.
        let store = try VaultStore.open(stateDirectory: dir.path + "/state", passwordHashing: .interactive)
        let items = try #require(store.itemRowsVersion)
        let record = { (op: AuditOperation) in
            AuditRecord(callerUID: 1000, callerPID: 1, executable: "/t", operation: op, service: "s", account: "a",
                        decision: .granted, method: .none, reason: nil, outcome: .ok)
        }
        var seen = items.current
        let item = try store.add(owner: 1000, NewItem(service: "s", account: "a"), secret: SecureBytes(copying: [1]), audit: record(.put))
        #expect(items.current != seen && items.current % 2 == 0)
        seen = items.current
        try store.append(record(.get))
        #expect(items.current == seen)
        let replaced = try store.replace(item, with: NewItem(service: "s", account: "a"), secret: SecureBytes(copying: [2]), audit: record(.update))
        #expect(items.current != seen && items.current % 2 == 0)
        seen = items.current
        try store.delete(replaced, audit: record(.delete))
        #expect(items.current != seen && items.current % 2 == 0)
    }

    /// The update hook sees only the watching connection's changes; a commit of another one
    /// (another process, or anyone writing the file by SQLite's rules) must move the version by
    /// the time the watcher's next write transaction has begun, else a row read before that
    /// commit would be taken as current (VaultStore.storedRowIs).
    @Test func watchedRowsVersionMovesWhenAnotherConnectionCommits() throws {
        let dir = TempDir()
        let path = dir.path + "/t.db"
        let db = try Database(path: path, create: true)
        try db.execute("PRAGMA journal_mode=WAL; CREATE TABLE items (k INTEGER PRIMARY KEY, v TEXT); CREATE TABLE other (k INTEGER PRIMARY KEY)")
        let version = try db.watchRows(of: "items")
        let other = try Database(path: path)

        let start = version.current
        try db.transaction { () throws(DatabaseError) in try db.execute("INSERT INTO other VALUES (1)") }
        #expect(version.current == start)  // its own commit, not of items: unchanged

        try other.execute("INSERT INTO items VALUES (1, 'elsewhere')")
        #expect(version.current == start)  // not seen until the watcher's next write transaction
        try db.transaction { () throws(DatabaseError) in
            #expect(version.current != start && version.current % 2 == 0)
        }
        let seen = version.current
        try db.transaction { () throws(DatabaseError) in try db.execute("INSERT INTO other VALUES (2)") }
        #expect(version.current == seen)  // nothing since

        // Any table: the pragma cannot tell which one another connection changed.
        try other.execute("INSERT INTO other VALUES (3)")
        _ = db.groupTransaction { true }
        #expect(version.current != seen && version.current % 2 == 0)
    }

    @Test func storeConnectionPragmas() throws {
        let dir = TempDir()
        let store = try openStore(dir)
        #expect(try store.db.pragma("journal_mode") == "wal")
        #expect(try store.db.pragma("synchronous") == "2")  // FULL
        #expect(try store.db.pragma("foreign_keys") == "1")
        #expect(try store.db.pragma("secure_delete") == "1")
        #expect(try store.db.pragma("user_version") == String(VaultStore.schemaVersion))
        store.close()
        #expect(throws: StoreError.closed) { try store.items(owner: 1) }
        #expect(throws: StoreError.auditWriteFailed) { try store.append(record()) }
    }

    @Test func notADatabaseIsRecognised() throws {
        let dir = TempDir()
        let path = dir.path + "/junk.db"
        try Data(repeating: 0x41, count: 4096).write(to: URL(fileURLWithPath: path))
        let db = try Database(path: path)
        #expect { try db.execute("SELECT count(*) FROM sqlite_master") } throws: { ($0 as? DatabaseError)?.isNotADatabase == true }
    }

    @Test func schemaMigrationsParse() {
        let ms = Schema.migrations
        #expect(ms.first?.version == 1)
        #expect(ms.map(\.version) == Array(1...Int64(ms.count)))
        #expect(ms[0].sql.contains("CREATE TABLE items"))
        // The embedded schema is the root schema.sql, byte for byte.
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent("schema.sql")
        #expect((try? [UInt8](Data(contentsOf: root))) == PackageResources.schema_sql)
        let parsed = Schema.parse("-- header\n-- migrate:1\nA;\n-- migrate:2\nB;\n")
        #expect(parsed.map(\.version) == [1, 2])
        #expect(parsed[1].sql.contains("B;"))
    }
}
