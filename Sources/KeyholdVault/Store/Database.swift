import CSQLite
import KeyholdCore

/// A failed SQLite call, by extended result code. Carries no SQL values, so it can be logged.
public struct DatabaseError: Error, Equatable, Sendable, CustomStringConvertible {
    /// Extended result code (`SQLITE_CONSTRAINT_UNIQUE` = 2067, …).
    public let code: Int32

    public init(code: Int32) { self.code = code }

    /// The primary result code (`SQLITE_CONSTRAINT`, `SQLITE_FULL`, …).
    public var primaryCode: Int32 { code & 0xff }

    /// Not an SQLite code: the connection was closed by this process.
    public static let closed = DatabaseError(code: -1)

    // Extended codes are C macro expressions Swift does not import: SQLITE_CONSTRAINT | (n << 8).
    static let constraintUnique: Int32 = 2067
    static let constraintPrimaryKey: Int32 = 1555

    public var isUniqueViolation: Bool { code == Self.constraintUnique || code == Self.constraintPrimaryKey }
    /// The file is not a database (or is encrypted by something else).
    public var isNotADatabase: Bool { primaryCode == SQLITE_NOTADB }

    public var description: String {
        self == .closed ? "database connection closed" : "SQLite error \(code): \(String(cString: sqlite3_errstr(code)))"
    }
}

/// SQLITE_TRANSIENT: SQLite copies bound bytes, so callers' buffers may go away at once.
let transient = csqlite_transient()

/// A small SQLite connection wrapper. Not thread-safe by design (opened NOMUTEX): the
/// broker serialises every store call behind one lock.
public final class Database {
    private var handle: OpaquePointer?
    private var cache: [String: Statement] = [:]
    /// `PRAGMA data_version`: moves when another connection has committed.
    func dataVersion() throws(DatabaseError) -> Int64 {
        try withStatement("PRAGMA data_version") { (s) throws(DatabaseError) in try s.step() ? s.int64(0) : 0 }
    }

    /// Opens an existing file (the store creates it itself, so the mode is not left to the
    /// umask). Symlinks are refused.
    public init(path: String, create: Bool = false, readOnly: Bool = false) throws(DatabaseError) {
        var flags = SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_NOFOLLOW
        flags |= readOnly ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE
        if create { flags |= SQLITE_OPEN_CREATE }
        var db: OpaquePointer?
        let rc = sqlite3_open_v2(path, &db, flags, nil)
        guard rc == SQLITE_OK, let db else {
            let code = db.map { sqlite3_extended_errcode($0) } ?? rc
            sqlite3_close_v2(db)
            throw DatabaseError(code: code == SQLITE_OK ? rc : code)
        }
        handle = db
        sqlite3_extended_result_codes(db, 1)
        sqlite3_busy_timeout(db, 5000)
    }

    deinit { close() }

    /// Finalises every cached statement and closes the connection. Idempotent.
    public func close() {
        for s in cache.values { s.finalize() }
        cache.removeAll()
        if let h = handle { sqlite3_close_v2(h) }
        handle = nil
    }

    private var db: OpaquePointer {
        get throws(DatabaseError) {
            guard let handle else { throw DatabaseError.closed }
            return handle
        }
    }

    /// A consistent image of the whole database, as a file of it would hold (`keyhold backup`):
    /// SQLite's online backup into an in-memory database in one read transaction, then serialized.
    func backupImage() throws(DatabaseError) -> [UInt8] {
        let source = try db
        let memory = try Database(path: ":memory:", create: true)
        defer { memory.close() }
        let destination = try memory.db
        guard let b = sqlite3_backup_init(destination, "main", source, "main") else { throw DatabaseError(code: sqlite3_errcode(destination)) }
        let step = sqlite3_backup_step(b, -1)
        let finish = sqlite3_backup_finish(b)
        guard step == SQLITE_DONE else { throw DatabaseError(code: step) }
        guard finish == SQLITE_OK else { throw DatabaseError(code: finish) }
        var size: sqlite3_int64 = 0
        guard let p = sqlite3_serialize(destination, "main", &size, 0) else { throw DatabaseError(code: SQLITE_NOMEM) }
        defer { sqlite3_free(p) }
        return Array(UnsafeBufferPointer(start: p, count: Int(size)))
    }

    /// Runs one or more statements without results (schema, pragmas that return nothing).
    public func execute(_ sql: String) throws(DatabaseError) {
        let h = try db
        let rc = sqlite3_exec(h, sql, nil, nil, nil)
        guard rc == SQLITE_OK else { throw DatabaseError(code: sqlite3_extended_errcode(h)) }
    }

    /// One transaction-control statement (BEGIN, COMMIT, SAVEPOINT …), prepared once and kept:
    /// `sqlite3_exec` would parse it again on every call.
    private func control(_ sql: String) throws(DatabaseError) {
        try withStatement(sql) { (s) throws(DatabaseError) in _ = try s.step() }
    }

    /// A pragma's single value as text (`journal_mode` answers "wal").
    public func pragma(_ text: String) throws(DatabaseError) -> String? {
        try withStatement("PRAGMA \(text)") { (s) throws(DatabaseError) -> String? in
            try s.step() ? s.text(0) : nil
        }
    }

    /// A cached prepared statement, reset and cleared after `body`, whatever it does.
    public func withStatement<R, E: Error>(_ sql: String, mapError: (DatabaseError) -> E,
                                           _ body: (Statement) throws(E) -> R) throws(E) -> R {
        let statement: Statement
        do { statement = try prepared(sql) } catch { throw mapError(error) }
        defer { statement.reset() }
        return try body(statement)
    }

    public func withStatement<R>(_ sql: String, _ body: (Statement) throws(DatabaseError) -> R) throws(DatabaseError) -> R {
        try withStatement(sql, mapError: { $0 }, body)
    }

    private func prepared(_ sql: String) throws(DatabaseError) -> Statement {
        if let s = cache[sql] { return s }
        let h = try db
        var stmt: OpaquePointer?
        let rc = sqlite3_prepare_v3(h, sql, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &stmt, nil)
        guard rc == SQLITE_OK, let stmt else { throw DatabaseError(code: sqlite3_extended_errcode(h)) }
        let s = Statement(stmt, db: h)
        cache[sql] = s
        return s
    }

    /// BEGIN IMMEDIATE … COMMIT; ROLLBACK when `body` throws or the commit fails. Failures of
    /// BEGIN and COMMIT go through `mapError` / `commitError`, so the caller decides what they
    /// mean (a failed COMMIT of an audited change is a failed audit write).
    /// Inside an open transaction (the broker's group commit) this is a SAVEPOINT instead: a
    /// failing body undoes only its own writes, and durability comes from the outer COMMIT.
    public func transaction<R, E: Error>(mapError: (DatabaseError) -> E, commitError: ((DatabaseError) -> E)? = nil,
                                         _ body: () throws(E) -> R) throws(E) -> R {
        if isInTransaction { return try savepoint(mapError: mapError, body) }
        do { try control("BEGIN IMMEDIATE") } catch { throw mapError(error) }
        let result: R
        do {
            result = try body()
        } catch {
            try? control("ROLLBACK")
            throw error
        }
        do {
            try control("COMMIT")
        } catch {
            // A failed COMMIT may leave the transaction open (SQLITE_BUSY) or already rolled back.
            if isInTransaction { try? control("ROLLBACK") }
            if let commitError { throw commitError(error) }
            throw mapError(error)
        }
        return result
    }

    /// One read transaction around `body`: its statements read one snapshot, and the snapshot
    /// is let go before this returns (a reader held open would hold up checkpoints).
    public func readTransaction<R, E: Error>(mapError: (DatabaseError) -> E, _ body: () throws(E) -> R) throws(E) -> R {
        do { try control("BEGIN") } catch { throw mapError(error) }
        defer { if isInTransaction { try? control("ROLLBACK") } }
        return try body()
    }

    /// Whether the file this connection has open is no longer the file at its path (moved,
    /// removed or replaced), as SQLite's unix VFS sees it; true when it cannot tell.
    public var fileHasMoved: Bool {
        guard let handle else { return true }
        var moved: Int32 = 1
        return sqlite3_file_control(handle, "main", SQLITE_FCNTL_HAS_MOVED, &moved) != SQLITE_OK || moved != 0
    }

    /// True between BEGIN and COMMIT/ROLLBACK.
    public var isInTransaction: Bool { handle.map { sqlite3_get_autocommit($0) == 0 } ?? false }

    private func savepoint<R, E: Error>(mapError: (DatabaseError) -> E, _ body: () throws(E) -> R) throws(E) -> R {
        do { try control("SAVEPOINT nested") } catch { throw mapError(error) }
        let result: R
        do {
            result = try body()
        } catch {
            try? control("ROLLBACK TO nested")
            try? control("RELEASE nested")
            throw error
        }
        do { try control("RELEASE nested") } catch { throw mapError(error) }
        return result
    }

    /// One outer transaction whose COMMIT (one fsync) makes every write `body` made durable.
    /// `body` runs its parts as nested transactions, and returns false to have everything rolled
    /// back instead. Returns whether the COMMIT succeeded; when it did not, everything was
    /// rolled back.
    public func groupTransaction(_ body: () -> Bool) -> Bool {
        do { try control("BEGIN IMMEDIATE") } catch { return false }
        guard body() else {
            try? control("ROLLBACK")
            return false
        }
        do {
            try control("COMMIT")
            return true
        } catch {
            if isInTransaction { try? control("ROLLBACK") }
            return false
        }
    }

    public func transaction<R>(_ body: () throws(DatabaseError) -> R) throws(DatabaseError) -> R {
        try transaction(mapError: { $0 }, body)
    }

    /// Rows changed by the last INSERT/UPDATE/DELETE.
    public var changes: Int { handle.map { Int(sqlite3_changes($0)) } ?? 0 }
}
