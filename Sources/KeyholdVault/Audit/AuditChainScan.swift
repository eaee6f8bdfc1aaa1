import CSQLite
import CSodium
import Glibc
import KeyholdCore

/// The fast path of `verifyAudit`: confirms an intact chain in one pass, reading rows straight
/// from SQLite's column memory into one reused buffer (no per-entry allocation).
///
/// It only ever answers "intact" or "not shown intact": any gap, bad MAC or tag, row beyond the
/// head, or I/O error sends `verifyAudit` to its sequential pass, which names the problem. So a
/// wrong answer here can cost time, never a false "intact": every entry from start to head is
/// checked against its predecessor's MAC, the first against the start, the last against the
/// tagged head.
extension VaultStore {
    func auditChainIntact(start: (seq: Int64, mac: [UInt8]), head: (seq: Int64, mac: [UInt8])) -> Bool {
        guard head.seq >= start.seq, start.mac.count == KeyedHash.byteCount, head.mac.count == KeyedHash.byteCount else { return false }
        let path = stateDirectory + "/" + StateDirectory.databaseFileName
        return auditKey.keyBytes.bytes.withUnsafeBytes { key in
            AuditChainScanner(path: path, expecting: fileIdentities, key: key)?.verify(
                after: start.seq, startMAC: start.mac, through: head.seq, endMAC: head.mac) ?? false
        }
    }
}

/// Reads the chain on its own read-only connection and checks every entry. The connection is
/// opened as every reader is (`StateDirectory.openReader`): its files must be the writer's, so
/// the scan never reads a file put at the vault's paths (a store that could not name its files
/// at open, as in some tools, opens the path as it is).
private struct AuditChainScanner {
    private let database: Database
    private let db: OpaquePointer
    private let key: UnsafeRawBufferPointer

    init?(path: String, expecting: [StateDirectory.FileIdentity], key: UnsafeRawBufferPointer) {
        let opened: Database
        do {
            opened = expecting.isEmpty ? try Database(path: path, readOnly: true) : try StateDirectory.openReader(path, expecting: expecting)
        } catch { return nil }
        guard let handle = opened.withHandle({ $0 }) else { return nil }
        // Read pages in place rather than copied into SQLite's cache (a sequential scan of the
        // whole log; read-only, so a damaged file can only fail a read, never be written).
        sqlite3_exec(handle, "PRAGMA mmap_size = 1073741824", nil, nil, nil)
        database = opened
        db = handle
        self.key = key
    }

    /// True when rows after..through are all present, in order, each MAC and entry tag right,
    /// the first chained to `startMAC`, the last equal to `endMAC`, and nothing beyond `through`.
    func verify(after: Int64, startMAC: [UInt8], through: Int64, endMAC: [UInt8]) -> Bool {
        defer { database.close() }
        // Read the whole chain in one snapshot.
        guard sqlite3_exec(db, "BEGIN", nil, nil, nil) == SQLITE_OK else { return false }
        defer { sqlite3_exec(db, "COMMIT", nil, nil, nil) }
        var previous = startMAC
        let sql = "SELECT \(VaultStore.auditColumns) FROM audit WHERE seq > ?1 ORDER BY seq"
        var stmt: OpaquePointer?
        guard sqlite3_prepare_v2(db, sql, -1, &stmt, nil) == SQLITE_OK, let stmt else { return false }
        defer { sqlite3_finalize(stmt) }
        sqlite3_bind_int64(stmt, 1, after)

        // Keyed BLAKE2b states that have absorbed the key and each domain label, copied per
        // entry; libsodium wants them 64-byte aligned.
        // (The state type's 64-byte alignment keeps it out of Swift: libsodium's functions take
        // it as an opaque pointer, and its size comes from libsodium.)
        let stateSize = (crypto_generichash_statebytes() + 63) & ~63
        let states = UnsafeMutableRawPointer.allocate(byteCount: 3 * stateSize, alignment: 64)
        defer { states.deallocate() }
        let macBase = OpaquePointer(states), tagBase = OpaquePointer(states + stateSize), work = OpaquePointer(states + 2 * stateSize)
        func absorb(_ state: OpaquePointer, _ domain: String) {
            crypto_generichash_init(state, key.baseAddress!.assumingMemoryBound(to: UInt8.self), key.count, KeyedHash.byteCount)
            let label = CanonicalEncoder(domain: domain).bytes
            crypto_generichash_update(state, label, UInt64(label.count))
        }
        absorb(macBase, "keyhold audit mac v1")
        absorb(tagBase, "keyhold audit entry v1")
        // input = len ‖ previous ‖ seq ‖ fields: the MAC covers all of it, the entry tag the fields.
        let fieldsStart = 4 + KeyedHash.byteCount + 8
        var input = EntryBuffer()
        defer { input.free() }
        var macDigest = [UInt8](repeating: 0, count: KeyedHash.byteCount), tagDigest = macDigest
        var expected = after + 1
        while true {
            let rc = sqlite3_step(stmt)
            if rc == SQLITE_DONE { break }
            guard rc == SQLITE_ROW, sqlite3_column_int64(stmt, 0) == expected, expected <= through else { return false }
            input.count = 0
            input.append(UInt32(KeyedHash.byteCount))
            previous.withUnsafeBytes { input.append($0.baseAddress!, $0.count) }
            input.append(UInt64(bitPattern: expected))
            Self.appendFields(stmt, to: &input)
            let intact = Self.hashEquals(from: macBase, work, stateSize, input.base, input.count, stmt, column: 12, &macDigest)
                && Self.hashEquals(from: tagBase, work, stateSize, input.base + fieldsStart, input.count - fieldsStart, stmt, column: 11, &tagDigest)
            guard intact else { return false }
            // Verified: its stored MAC (equal to the digest) is what the next entry chains to.
            swap(&previous, &macDigest)
            expected += 1
        }
        return expected == through + 1 && KeyedHash.equal(previous, endMAC)
    }

    /// Keyed BLAKE2b of `base` (a state with key and label absorbed) continued with `message`,
    /// compared in constant time with the 32-byte blob in `column`.
    private static func hashEquals(from base: OpaquePointer, _ work: OpaquePointer, _ stateSize: Int,
                                   _ message: UnsafePointer<UInt8>, _ count: Int, _ stmt: OpaquePointer, column: Int32,
                                   _ digest: inout [UInt8]) -> Bool {
        UnsafeMutableRawPointer(work).copyMemory(from: UnsafeRawPointer(base), byteCount: stateSize)
        guard crypto_generichash_update(work, message, UInt64(count)) == 0,
              crypto_generichash_final(work, &digest, KeyedHash.byteCount) == 0,
              let stored = sqlite3_column_blob(stmt, column), sqlite3_column_bytes(stmt, column) == Int32(KeyedHash.byteCount) else {
            return false
        }
        return crypto_verify_32(digest, stored.assumingMemoryBound(to: UInt8.self)) == 0
    }

    /// Column `c` as `AuditRow` reads it (stored bytes; NULL as empty), length-prefixed.
    private static func appendBytes(_ stmt: OpaquePointer, _ c: Int32, to out: inout EntryBuffer) {
        let p = sqlite3_column_blob(stmt, c)
        let n = Int(sqlite3_column_bytes(stmt, c))
        out.append(UInt32(n))
        if n > 0, let p { out.append(p, n) }
    }

    private static func appendOptional(_ stmt: OpaquePointer, _ c: Int32, to out: inout EntryBuffer) {
        if sqlite3_column_type(stmt, c) == SQLITE_NULL { out.append(byte: 0); return }
        out.append(byte: 1)
        appendBytes(stmt, c, to: &out)
    }

    /// The same bytes as `AuditFields.encode(into:)` of `AuditRow(stmt)`.
    private static func appendFields(_ stmt: OpaquePointer, to out: inout EntryBuffer) {
        for c in Int32(1)...3 { out.append(UInt64(bitPattern: sqlite3_column_int64(stmt, c))) }
        appendBytes(stmt, 4, to: &out)
        appendBytes(stmt, 5, to: &out)
        appendOptional(stmt, 6, to: &out)
        appendOptional(stmt, 7, to: &out)
        for c in Int32(8)...10 { appendBytes(stmt, c, to: &out) }
    }
}

/// One entry's hash input, rebuilt per row in one reused allocation: plain memory writes, no
/// array bookkeeping per byte (this loop runs a million times for a million entries).
private struct EntryBuffer {
    private(set) var base: UnsafeMutablePointer<UInt8>
    private var capacity: Int
    var count = 0

    init() {
        capacity = 1024
        base = .allocate(capacity: capacity)
    }

    func free() { base.deallocate() }

    private mutating func reserve(_ n: Int) {
        guard count + n > capacity else { return }
        var grown = capacity * 2
        while grown < count + n { grown *= 2 }
        let bigger = UnsafeMutablePointer<UInt8>.allocate(capacity: grown)
        bigger.update(from: base, count: count)
        base.deallocate()
        base = bigger
        capacity = grown
    }

    mutating func append(byte: UInt8) {
        reserve(1)
        base[count] = byte
        count += 1
    }

    mutating func append(_ v: UInt32) {
        reserve(4)
        var be = v.bigEndian
        withUnsafeBytes(of: &be) { (base + count).update(from: $0.bindMemory(to: UInt8.self).baseAddress!, count: 4) }
        count += 4
    }

    mutating func append(_ v: UInt64) {
        reserve(8)
        var be = v.bigEndian
        withUnsafeBytes(of: &be) { (base + count).update(from: $0.bindMemory(to: UInt8.self).baseAddress!, count: 8) }
        count += 8
    }

    mutating func append(_ p: UnsafeRawPointer, _ n: Int) {
        reserve(n)
        (base + count).update(from: p.assumingMemoryBound(to: UInt8.self), count: n)
        count += n
    }
}
