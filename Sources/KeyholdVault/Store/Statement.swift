import Glibc
import CSQLite
import KeyholdCore

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

    public func text(_ column: Int32) -> String {
        guard let p = sqlite3_column_text(stmt, column) else { return "" }
        let n = Int(sqlite3_column_bytes(stmt, column))
        return String(decoding: UnsafeBufferPointer(start: p, count: n), as: UTF8.self)
    }

    public func optionalText(_ column: Int32) -> String? { isNull(column) ? nil : text(column) }
}
