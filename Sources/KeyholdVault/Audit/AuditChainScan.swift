import CSQLite
import CSodium
import Glibc
import KeyholdCore

/// The fast path of `verifyAudit`: confirms an intact chain using every core.
///
/// Each entry's MAC covers the previous entry's *stored* MAC, so once the stored links are
/// compared every entry can be checked independently of the others: the range from the start
/// (genesis or checkpoint) to the head is cut into one slice per core, each slice read on its
/// own read-only SQLite connection and checked on its own thread. Rows are hashed straight from
/// SQLite's column memory into one reused buffer (no per-entry allocation).
///
/// It only ever answers "intact" or "not shown intact": any gap, bad MAC or tag, row beyond the
/// head, or I/O error sends `verifyAudit` to its sequential pass, which names the problem. So a
/// wrong answer here can cost time, never a false "intact": every entry from start to head is
/// checked against its predecessor's MAC, the first against the start, the last against the
/// tagged head.
extension VaultStore {
    /// Below this many entries per slice, one thread does it all.
    static let minimumEntriesPerSlice: Int64 = 16_384

    func auditChainIntact(start: (seq: Int64, mac: [UInt8]), head: (seq: Int64, mac: [UInt8]),
                          slices requested: Int? = nil) -> Bool {
        let total = head.seq - start.seq
        guard total >= 0, start.mac.count == KeyedHash.byteCount, head.mac.count == KeyedHash.byteCount else { return false }
        let cores = max(1, Int(sysconf(Int32(_SC_NPROCESSORS_ONLN))))
        let slices = requested ?? Int(min(Int64(min(cores, 8)), max(1, total / Self.minimumEntriesPerSlice)))
        let path = stateDirectory + "/" + StateDirectory.databaseFileName
        let files = fileIdentities
        // Slice i covers (bounds[i], bounds[i + 1]]; the last one has no upper bound, so a row
        // beyond the head is seen.
        var bounds: [Int64] = (0..<slices).map { start.seq + total * Int64($0) / Int64(slices) }
        bounds.append(head.seq)
        let results = UnsafeMutableBufferPointer<Bool>.allocate(capacity: slices)
        results.initialize(repeating: false)
        defer { results.deallocate() }
        auditKey.keyBytes.bytes.withUnsafeBytes { key in
            let work = { (i: Int) in
                results[i] = AuditSliceScanner(path: path, expecting: files, key: key)?.verify(
                    after: bounds[i], startMAC: i == 0 ? start.mac : nil, through: bounds[i + 1],
                    endMAC: i == slices - 1 ? head.mac : nil, isLast: i == slices - 1) ?? false
            }
            let threads = (1..<slices).map { i in SliceThread { work(i) } }
            work(0)
            threads.forEach { $0.join() }
        }
        return results.allSatisfy { $0 }
    }
}

/// One thread running one closure, on plain pthreads (the vault does not load Foundation).
private final class SliceThread: @unchecked Sendable {
    private var thread = pthread_t()
    private var started = false
    private let body: () -> Void

    init(_ body: @escaping () -> Void) {
        self.body = body
        let box = Unmanaged.passRetained(self).toOpaque()
        started = pthread_create(&thread, nil, { raw in
            let me = Unmanaged<SliceThread>.fromOpaque(raw!).takeRetainedValue()
            me.body()
            return nil
        }, box) == 0
        if !started {
            Unmanaged<SliceThread>.fromOpaque(box).release()
            body()  // no thread: do the work here
        }
    }

    func join() { if started { pthread_join(thread, nil) } }
}

/// Reads one slice of the chain on its own read-only connection and checks every entry. The
/// connection is opened as every reader is (`StateDirectory.openReader`): its files must be the
/// writer's, so a slice never reads a file put at the vault's paths (a store that could not name
/// its files at open, as in some tools, opens the path as it is).
private struct AuditSliceScanner {
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
    /// the first chained to `startMAC` (or to the stored MAC of row `after`), the last equal to
    /// `endMAC` when given, and (for the last slice) nothing beyond `through`.
    func verify(after: Int64, startMAC: [UInt8]?, through: Int64, endMAC: [UInt8]?, isLast: Bool) -> Bool {
        defer { database.close() }
        // Read the whole slice in one snapshot.
        guard sqlite3_exec(db, "BEGIN", nil, nil, nil) == SQLITE_OK else { return false }
        defer { sqlite3_exec(db, "COMMIT", nil, nil, nil) }
        var previous = [UInt8](repeating: 0, count: KeyedHash.byteCount)
        if let startMAC {
            previous = startMAC
        } else {
            guard let mac = storedMAC(seq: after) else { return false }
            previous = mac
        }
        let sql = "SELECT \(VaultStore.auditColumns) FROM audit WHERE seq > ?1 AND seq <= ?2 ORDER BY seq"
        var stmt: OpaquePointer?
        guard sqlite3_prepare_v2(db, sql, -1, &stmt, nil) == SQLITE_OK, let stmt else { return false }
        defer { sqlite3_finalize(stmt) }
        sqlite3_bind_int64(stmt, 1, after)
        sqlite3_bind_int64(stmt, 2, isLast ? Int64.max : through)

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
        guard expected == through + 1 else { return false }
        if let endMAC { return KeyedHash.equal(previous, endMAC) }
        return true
    }

    private func storedMAC(seq: Int64) -> [UInt8]? {
        var stmt: OpaquePointer?
        guard sqlite3_prepare_v2(db, "SELECT mac FROM audit WHERE seq = ?1", -1, &stmt, nil) == SQLITE_OK, let stmt else { return nil }
        defer { sqlite3_finalize(stmt) }
        sqlite3_bind_int64(stmt, 1, seq)
        guard sqlite3_step(stmt) == SQLITE_ROW, let p = sqlite3_column_blob(stmt, 0),
              sqlite3_column_bytes(stmt, 0) == Int32(KeyedHash.byteCount) else { return nil }
        return Array(UnsafeRawBufferPointer(start: p, count: KeyedHash.byteCount))
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
