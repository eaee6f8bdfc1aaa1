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
