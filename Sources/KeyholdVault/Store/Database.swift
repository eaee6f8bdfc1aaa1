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
private let transient = csqlite_transient()

/// Process-wide SQLite settings, applied once before the first connection (a Swift global is
/// initialised once, thread-safely, on first use).
let sqliteLibraryConfigured: Void = { _ = csqlite_memstatus_off() }()

/// A small SQLite connection wrapper. Not thread-safe by design (opened NOMUTEX): the
/// broker serialises every store call behind one lock.
public final class Database {
    private var handle: OpaquePointer?
    private var cache: [String: Statement] = [:]
    /// The table whose row changes this connection counts (`watchRows`), if any.
    private var rowWatch: RowsVersion?
    /// Moves whenever a write transaction begins or ends and whenever anything may have undone
    /// writes (a rollback, a rollback to a savepoint, a statement that failed): `writeSnapshot`.
    private var stateSerial: UInt64 = 0
    private var inWriteTransaction = false

    /// Inside a write transaction: a value that stays the same exactly while nothing this
    /// connection wrote since it was taken has been undone, and no other connection can have
    /// committed (the write lock is held). nil outside one. What was read and checked under one
    /// value is still what the database holds while it is unchanged, apart from this
    /// connection's own later writes.
    public var writeSnapshot: UInt64? { inWriteTransaction && isInTransaction ? stateSerial : nil }

    private func beganWriteTransaction() {
        inWriteTransaction = true
        stateSerial &+= 1
    }

    /// Opens an existing file (the store creates it itself, so the mode is not left to the
    /// umask). Symlinks are refused.
    public init(path: String, create: Bool = false, readOnly: Bool = false) throws(DatabaseError) {
        sqliteLibraryConfigured
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

    /// The raw connection, for the audit chain's fast scan (AuditChainScan.swift), which reads
    /// rows straight from SQLite's column memory; nil once closed.
    func withHandle<R>(_ body: (OpaquePointer) -> R) -> R? {
        handle.map(body)
    }

    /// Runs one or more statements without results (schema, pragmas that return nothing).
    public func execute(_ sql: String) throws(DatabaseError) {
        let h = try db
        let rc = sqlite3_exec(h, sql, nil, nil, nil)
        settleRows()
        stateSerial &+= 1  // whatever it ran
        if sqlite3_get_autocommit(h) != 0 { inWriteTransaction = false }
        guard rc == SQLITE_OK else { throw DatabaseError(code: sqlite3_extended_errcode(h)) }
    }

    /// From now on, counts the changes this connection makes to the rows of `table` (one table
    /// per connection): the version it returns moves with every change that commits here, and
    /// is odd while one is uncommitted (csqlite_watch_rows). Changes made by other connections
    /// are not counted.
    public func watchRows(of table: String) throws(DatabaseError) -> RowsVersion {
        let h = try db
        let watch = RowsVersion(table: table)
        rowWatch = watch
        csqlite_watch_rows(h, watch.watch)
        return watch
    }

    /// Makes the watched version even once no transaction is open (after every statement).
    private func settleRows() {
        if let rowWatch, let handle, sqlite3_get_autocommit(handle) != 0 { csqlite_rows_settled(rowWatch.watch) }
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
        defer {
            statement.reset()
            settleRows()
            if inWriteTransaction, let handle, sqlite3_get_autocommit(handle) != 0 {
                inWriteTransaction = false
                stateSerial &+= 1
            }
        }
        do { return try body(statement) } catch {
            stateSerial &+= 1  // a failed statement may have undone its own writes, or more
            throw error
        }
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
        beganWriteTransaction()
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
            stateSerial &+= 1
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
        beganWriteTransaction()
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

/// The version of one table's rows as the connection that watches them changes them
/// (`Database.watchRows`); read from any thread. Outlives the connection's hook: the connection
/// keeps it, and SQLite drops the hook when the connection closes.
public final class RowsVersion: @unchecked Sendable {
    let watch: UnsafeMutablePointer<csqlite_row_watch>

    init(table: String) {
        watch = .allocate(capacity: 1)
        watch.initialize(to: csqlite_row_watch())
        withUnsafeMutableBytes(of: &watch.pointee.table) { buffer in
            let name = Array(table.utf8.prefix(buffer.count - 1))
            buffer.copyBytes(from: name)
        }
    }

    deinit { watch.deallocate() }

    /// Even: no change to the rows is uncommitted. Any committed change since an earlier reading
    /// makes it differ from that reading.
    public var current: UInt64 { csqlite_rows_version(watch) }
}

/// A prepared statement. Indexes are 1-based for binds (as in SQLite), 0-based for columns.
public final class Statement {
    private var stmt: OpaquePointer?
    private let db: OpaquePointer

    init(_ stmt: OpaquePointer, db: OpaquePointer) { self.stmt = stmt; self.db = db }

    func finalize() { sqlite3_finalize(stmt); stmt = nil }

    func reset() {
        sqlite3_reset(stmt)
        sqlite3_clear_bindings(stmt)
    }

    private func check(_ rc: Int32) throws(DatabaseError) {
        guard rc == SQLITE_OK else { throw DatabaseError(code: sqlite3_extended_errcode(db)) }
    }

    public func bind(_ index: Int32, _ value: Int64) throws(DatabaseError) {
        try check(sqlite3_bind_int64(stmt, index, value))
    }

    public func bind(_ index: Int32, blob: [UInt8]) throws(DatabaseError) {
        // A zero-length blob still binds as a blob (not NULL): SQLite wants a non-nil pointer.
        let rc = blob.withUnsafeBytes { raw in
            raw.count == 0 ? sqlite3_bind_zeroblob(stmt, index, 0)
                : sqlite3_bind_blob(stmt, index, raw.baseAddress, Int32(raw.count), transient)
        }
        try check(rc)
    }

    public func bind(_ index: Int32, text: String) throws(DatabaseError) {
        // Length-explicit, so text with an embedded NUL is stored whole, not cut short. SQLite
        // copies it (transient), so the string's own bytes are bound where it has them.
        func bind(_ raw: UnsafeRawBufferPointer) -> Int32 {
            raw.count == 0 ? sqlite3_bind_text(stmt, index, "", 0, transient)
                : sqlite3_bind_text(stmt, index, raw.baseAddress!.assumingMemoryBound(to: CChar.self), Int32(raw.count), transient)
        }
        let rc = text.utf8.withContiguousStorageIfAvailable { bind(UnsafeRawBufferPointer($0)) }
            ?? Array(text.utf8).withUnsafeBytes { bind($0) }
        try check(rc)
    }

    public func bindNull(_ index: Int32) throws(DatabaseError) { try check(sqlite3_bind_null(stmt, index)) }

    public func bind(_ index: Int32, blob: [UInt8]?) throws(DatabaseError) {
        if let blob { try bind(index, blob: blob) } else { try bindNull(index) }
    }

    public func bind(_ index: Int32, text: String?) throws(DatabaseError) {
        if let text { try bind(index, text: text) } else { try bindNull(index) }
    }

    /// True for a row, false when done.
    @discardableResult
    public func step() throws(DatabaseError) -> Bool {
        switch sqlite3_step(stmt) {
        case SQLITE_ROW: return true
        case SQLITE_DONE: return false
        default: throw DatabaseError(code: sqlite3_extended_errcode(db))
        }
    }

    public func isNull(_ column: Int32) -> Bool { sqlite3_column_type(stmt, column) == SQLITE_NULL }

    public func int64(_ column: Int32) -> Int64 { sqlite3_column_int64(stmt, column) }

    public func blob(_ column: Int32) -> [UInt8] {
        let n = Int(sqlite3_column_bytes(stmt, column))
        guard n > 0, let p = sqlite3_column_blob(stmt, column) else { return [] }
        return Array(UnsafeRawBufferPointer(start: p, count: n))
    }

    public func optionalBlob(_ column: Int32) -> [UInt8]? { isNull(column) ? nil : blob(column) }

    /// Whether `blob(column)` would equal `bytes`, without copying the column.
    func blobIs(_ column: Int32, _ bytes: [UInt8]) -> Bool {
        let n = Int(sqlite3_column_bytes(stmt, column))
        guard n == bytes.count else { return false }
        guard n > 0 else { return true }
        guard let p = sqlite3_column_blob(stmt, column) else { return false }
        return bytes.withUnsafeBytes { memcmp(p, $0.baseAddress!, n) == 0 }
    }

    /// Whether `optionalBlob(column)` would equal `bytes`.
    func optionalBlobIs(_ column: Int32, _ bytes: [UInt8]?) -> Bool {
        guard let bytes else { return isNull(column) }
        return !isNull(column) && blobIs(column, bytes)
    }

    /// Whether the column's text is byte for byte `text` (stricter than comparing `text(column)`,
    /// which repairs invalid UTF-8).
    func textIs(_ column: Int32, _ text: String) -> Bool {
        guard let p = sqlite3_column_text(stmt, column) else { return text.isEmpty }
        let n = Int(sqlite3_column_bytes(stmt, column))
        let utf8 = text.utf8
        guard utf8.count == n else { return false }
        guard n > 0 else { return true }
        return utf8.withContiguousStorageIfAvailable { memcmp(p, $0.baseAddress!, n) == 0 }
            ?? Array(utf8).withUnsafeBytes { memcmp(p, $0.baseAddress!, n) == 0 }
    }

    public func text(_ column: Int32) -> String {
        guard let p = sqlite3_column_text(stmt, column) else { return "" }
        let n = Int(sqlite3_column_bytes(stmt, column))
        return String(decoding: UnsafeBufferPointer(start: p, count: n), as: UTF8.self)
    }

    public func optionalText(_ column: Int32) -> String? { isNull(column) ? nil : text(column) }
}
