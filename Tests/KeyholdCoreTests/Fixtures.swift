import CSQLite
import Foundation
import KeyholdCore
import KeyholdVault
import Testing

/// A private temporary directory under /tmp (short path), removed when the fixture goes away.
final class TempDir {
    let path: String

    init() {
        var template = Array("/tmp/kh-XXXXXX".utf8CString)
        let p = template.withUnsafeMutableBufferPointer { mkdtemp($0.baseAddress!) }
        precondition(p != nil, "mkdtemp failed")
        path = String(cString: p!)
    }

    /// A state directory inside (not yet created, so the store creates it 0700).
    var state: String { path + "/state" }

    deinit { try? FileManager.default.removeItem(atPath: path) }
}

func secret(_ text: String) -> SecureBytes { SecureBytes(copying: Array(text.utf8)) }

/// An application password derived for sealing (fresh salt, the tests' cheap Argon2id limits).
func sealingKey(_ password: String) throws -> AppPasswordKey {
    try AppPasswordKey.sealing(password: secret(password), strength: .interactive)
}

/// An application password derived for opening `item` (its stored salt and limits).
func openingKey(_ item: StoredItem, _ password: String) throws -> AppPasswordKey {
    try AppPasswordKey.opening(item, password: secret(password))
}

func string(_ bytes: SecureBytes) -> String { bytes.withUnsafeBytes { String(decoding: $0, as: UTF8.self) } }

func record(_ op: AuditOperation = .put, uid: UInt32 = 1000, service: String? = nil, account: String? = nil,
            reason: String? = nil, decision: AuditDecision = .granted, method: AuthMethod = .none,
            outcome: Outcome = .ok) -> AuditRecord {
    AuditRecord(callerUID: uid, callerPID: 4242, executable: "/usr/bin/kh-test-client", operation: op,
                service: service, account: account, decision: decision, method: method, reason: reason, outcome: outcome)
}

func openStore(_ dir: TempDir) throws -> VaultStore {
    try VaultStore.open(stateDirectory: dir.state, passwordHashing: .interactive)
}

/// Direct access to the database file with the sqlite3 C API, bypassing the store: how an
/// attacker with write access to the file would edit it. Use only while the store is closed.
final class RawDatabase {
    private var db: OpaquePointer?

    init(_ path: String) throws {
        guard sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, nil) == SQLITE_OK else {
            throw RawError.sqlite(sqlite3_errcode(db))
        }
    }

    deinit { sqlite3_close_v2(db) }

    enum RawError: Error { case sqlite(Int32) }

    func exec(_ sql: String) throws {
        let rc = sqlite3_exec(db, sql, nil, nil, nil)
        guard rc == SQLITE_OK else { throw RawError.sqlite(sqlite3_extended_errcode(db)) }
    }

    /// First column of every row, as blobs.
    func blobs(_ sql: String) throws -> [[UInt8]] {
        var stmt: OpaquePointer?
        guard sqlite3_prepare_v2(db, sql, -1, &stmt, nil) == SQLITE_OK else { throw RawError.sqlite(sqlite3_errcode(db)) }
        defer { sqlite3_finalize(stmt) }
        var out: [[UInt8]] = []
        while sqlite3_step(stmt) == SQLITE_ROW {
            let n = Int(sqlite3_column_bytes(stmt, 0))
            if n == 0 { out.append([]); continue }
            out.append(Array(UnsafeRawBufferPointer(start: sqlite3_column_blob(stmt, 0), count: n)))
        }
        return out
    }

    func int(_ sql: String) throws -> Int64 {
        var stmt: OpaquePointer?
        guard sqlite3_prepare_v2(db, sql, -1, &stmt, nil) == SQLITE_OK else { throw RawError.sqlite(sqlite3_errcode(db)) }
        defer { sqlite3_finalize(stmt) }
        guard sqlite3_step(stmt) == SQLITE_ROW else { throw RawError.sqlite(sqlite3_errcode(db)) }
        return sqlite3_column_int64(stmt, 0)
    }

    /// Sets one blob column of one row (`WHERE` given as SQL) to `value`.
    func setBlob(_ table: String, _ column: String, _ value: [UInt8], where condition: String) throws {
        var stmt: OpaquePointer?
        let sql = "UPDATE \(table) SET \(column) = ?1 WHERE \(condition)"
        guard sqlite3_prepare_v2(db, sql, -1, &stmt, nil) == SQLITE_OK else { throw RawError.sqlite(sqlite3_errcode(db)) }
        defer { sqlite3_finalize(stmt) }
        _ = value.withUnsafeBytes { sqlite3_bind_blob(stmt, 1, $0.baseAddress, Int32($0.count), csqlite_transient()) }
        guard sqlite3_step(stmt) == SQLITE_DONE else { throw RawError.sqlite(sqlite3_errcode(db)) }
    }

    static func hex(_ bytes: [UInt8]) -> String { bytes.map { String(format: "%02x", $0) }.joined() }
}

func fileMode(_ path: String) -> mode_t {
    var st = stat()
    precondition(lstat(path, &st) == 0)
    return st.st_mode & 0o7777
}

func fileBytes(_ path: String) -> [UInt8] {
    (try? [UInt8](Data(contentsOf: URL(fileURLWithPath: path)))) ?? []
}

func contains(_ haystack: [UInt8], _ needle: [UInt8]) -> Bool {
    guard !needle.isEmpty, haystack.count >= needle.count else { return false }
    let first = needle[0]
    var i = 0
    let last = haystack.count - needle.count
    while i <= last {
        if haystack[i] == first && Array(haystack[i..<i + needle.count]) == needle { return true }
        i += 1
    }
    return false
}

/// Whole listings and searches, read page by page as the broker reads them (only the tests want
/// one array).
extension VaultStore {
    func items(owner: UInt32) throws(StoreError) -> (items: [StoredItem], damaged: Int) {
        try allPages { (cursor) throws(StoreError) in try items(owner: owner, after: cursor, limit: 10_000) }
    }

    func search(owner: UInt32, attributes query: [String: String]) throws(StoreError) -> (items: [StoredItem], damaged: Int) {
        try allPages { (cursor) throws(StoreError) in try search(owner: owner, attributes: query, after: cursor, limit: 10_000) }
    }

    private func allPages(_ page: (ItemPageCursor?) throws(StoreError) -> ItemPage)
        throws(StoreError) -> (items: [StoredItem], damaged: Int) {
        var all: [StoredItem] = []
        var damaged = 0
        var cursor: ItemPageCursor?
        repeat {
            let p = try page(cursor)
            all += p.items
            damaged += p.damaged
            cursor = p.next
        } while cursor != nil
        return (all, damaged)
    }
}
