import KeyholdCore

/// Audit export that verifies on its own: each exported entry carries its readable fields AND
/// the exact row bytes its chain MAC covers, with its previous MAC; the export's header says
/// where the chain starts (genesis or a checkpoint) and where it ends, under a tag only the
/// broker's audit key can make. A verifier with that key checks the MACs, the links, the seqs,
/// the header's ends, and that every readable field is what the row decodes to, so editing any
/// human-readable field of a file is caught as surely as editing its MACs.

extension AuditExportHeader {
    static func tag(startSeq: Int64, startMAC: [UInt8], throughSeq: Int64, throughMAC: [UInt8], key: AuditKey) -> [UInt8] {
        var e = CanonicalEncoder(domain: "keyhold audit export v1")
        e.append(startSeq)
        e.append(bytes: startMAC)
        e.append(throughSeq)
        e.append(bytes: throughMAC)
        return KeyedHash.hash(e.bytes, key: key)
    }
}

/// Checks an export streamed row by row, in file order. Holds only the keys and the running
/// chain value, so exports of any length verify in constant memory.
public struct AuditExportVerifier: Sendable {
    public let header: AuditExportHeader
    private let auditKey: AuditKey
    private let attributeKey: AttributeKey
    private var expected: Int64
    private var previous: [UInt8]
    private var verified: Int64 = 0
    private var failure: (seq: Int64, problem: AuditExportProblem)?
    /// A seq that was not where it belonged: `removed` unless it turns up later (`reordered`).
    private var missing: Int64?

    init(header: AuditExportHeader, auditKey: AuditKey, attributeKey: AttributeKey) {
        self.header = header
        self.auditKey = auditKey
        self.attributeKey = attributeKey
        expected = header.startSeq &+ 1
        previous = header.startMAC
        let n = AuditExportRow.macBytes
        let shaped = header.startSeq >= 0 && header.throughSeq >= header.startSeq
            && header.startMAC.count == n && header.throughMAC.count == n && header.tag.count == n
        let valid = shaped
            && KeyedHash.equal(header.tag, AuditExportHeader.tag(startSeq: header.startSeq, startMAC: header.startMAC,
                                                                 throughSeq: header.throughSeq, throughMAC: header.throughMAC,
                                                                 key: auditKey))
            && (header.startSeq != 0 || KeyedHash.equal(header.startMAC, VaultStore.genesisMAC(key: auditKey)))
        if !valid { failure = (0, .header) }
    }

    /// Feeds the next row of the file.
    public mutating func add(_ r: AuditExportRow) {
        if let gap = missing {
            if r.seq == gap { failure = (gap, .reordered); missing = nil }
            return
        }
        guard failure == nil else { return }
        guard r.seq == expected else {
            if r.seq > expected && expected <= header.throughSeq { missing = expected } else { failure = (expected, .inserted) }
            return
        }
        guard r.seq <= header.throughSeq else { failure = (r.seq, .inserted); return }
        guard r.previousMAC.count == AuditExportRow.macBytes, r.mac.count == AuditExportRow.macBytes,
              KeyedHash.equal(r.previousMAC, previous),
              let fields = VaultStore.AuditFields(row: r.row),
              KeyedHash.equal(VaultStore.chainMAC(previous: previous, seq: r.seq, fields, key: auditKey), r.mac) else {
            failure = (r.seq, .altered)
            return
        }
        guard let decoded = VaultStore.readable(seq: r.seq, fields, key: attributeKey), decoded == r.readable else {
            failure = (r.seq, .readableMismatch)
            return
        }
        previous = r.mac
        expected += 1
        verified += 1
    }

    /// The verdict once every row was fed.
    public func finish() -> AuditExportVerification {
        if let failure { return .broken(seq: failure.seq, problem: failure.problem) }
        if let missing { return .broken(seq: missing, problem: .removed) }
        if expected <= header.throughSeq { return .broken(seq: expected, problem: .truncated) }
        // The chain ends on the MAC the header vouches for (a tagged header makes this hold).
        guard KeyedHash.equal(previous, header.throughMAC) else { return .broken(seq: header.throughSeq, problem: .altered) }
        return .intact(count: verified)
    }

    /// Convenience for a whole export in memory.
    public static func verify(_ rows: [AuditExportRow], with verifier: AuditExportVerifier) -> AuditExportVerification {
        var v = verifier
        for r in rows { v.add(r) }
        return v.finish()
    }
}

extension VaultStore.AuditFields {
    /// The canonical row bytes (what `encode(into:)` appends, without a domain label).
    var rowBytes: [UInt8] {
        // An empty domain label encodes as a 4-byte zero length; drop it.
        var e = CanonicalEncoder(domain: "")
        encode(into: &e)
        return Array(e.bytes.dropFirst(4))
    }

    /// Strict inverse of `rowBytes`: nil unless `row` is exactly one canonical row, so
    /// re-encoding what this returns gives back the same bytes.
    init?(row: [UInt8]) {
        guard row.count <= AuditExportRow.maxRowBytes else { return nil }
        var d = CanonicalDecoder(row)
        func optional(_ d: inout CanonicalDecoder) -> [UInt8]?? {
            switch d.uint8() {
            case 0: return .some(nil)
            case 1: return d.field().map { .some($0) }
            default: return nil
            }
        }
        guard let time = d.uint64(), let uid = d.uint64(), let pid = d.uint64(),
              let executable = d.field(), let operation = d.field(),
              let itemID = optional(&d), let details = optional(&d),
              let decision = d.field(), let method = d.field(), let outcome = d.field(), d.isAtEnd else { return nil }
        self.init(time: Int64(bitPattern: time), uid: Int64(bitPattern: uid), pid: Int64(bitPattern: pid),
                  executable: executable, operation: operation, itemID: itemID, details: details,
                  decision: decision, method: method, outcome: outcome)
    }
}

extension VaultStore {
    /// What a row says, readable: the sealed names opened under the attribute key. Nil when the
    /// names do not open or a stored value is not what the broker writes (ids, UTF-8, ranges).
    static func readable(seq: Int64, _ f: AuditFields, key: AttributeKey) -> AuditReadableFields? {
        var names: (service: String?, account: String?, reason: String?) = (nil, nil, nil)
        if let raw = f.details {
            guard let opened = openDetails(seq: seq, raw, key: key) else { return nil }
            names = opened
        }
        func text(_ b: [UInt8]) -> String? { String(validating: b, as: UTF8.self) }
        var itemID: String?
        if let raw = f.itemID {
            guard let id = ItemID(bytes: raw) else { return nil }
            itemID = id.description
        }
        guard let uid = UInt32(exactly: f.uid), let pid = Int32(exactly: f.pid),
              let executable = text(f.executable), let operation = text(f.operation), let decision = text(f.decision),
              let method = text(f.method), let outcome = text(f.outcome) else { return nil }
        return AuditReadableFields(time: f.time, callerUID: uid, callerPID: pid, executable: executable,
                                   operation: operation, itemID: itemID, service: names.service, account: names.account,
                                   decision: decision, method: method, reason: names.reason, outcome: outcome)
    }

    /// The header of an export of every entry after the chain's start (the checkpoint, or
    /// genesis) through `throughSeq` (nil or at/below the start: an empty export).
    /// `.integrity` if the checkpoint's tag is wrong or the last entry is missing.
    public func auditExportHeader(throughSeq: Int64?) throws(StoreError) -> AuditExportHeader {
        let checkpoint: Head?
        var lastMAC: [UInt8]?
        do throws(DatabaseError) {
            checkpoint = try readCheckpoint()
            if let t = throughSeq {
                lastMAC = try db.withStatement("SELECT mac FROM audit WHERE seq = ?1") { (s) throws(DatabaseError) -> [UInt8]? in
                    try s.bind(1, t)
                    return try s.step() ? s.blob(0) : nil
                }
            }
        } catch {
            throw StoreError.from(error)
        }
        var start: (seq: Int64, mac: [UInt8]) = (0, genesisMAC)
        if let cp = checkpoint {
            guard cp.mac.count == AuditExportRow.macBytes, KeyedHash.equal(cp.tag, checkpointTag(seq: cp.seq, mac: cp.mac)) else {
                throw .integrity
            }
            start = (cp.seq, cp.mac)
        }
        var through = start
        if let t = throughSeq, t > start.seq {
            guard let lastMAC, lastMAC.count == AuditExportRow.macBytes else { throw .integrity }
            through = (t, lastMAC)
        }
        return AuditExportHeader(startSeq: start.seq, startMAC: start.mac, throughSeq: through.seq, throughMAC: through.mac,
                                 tag: AuditExportHeader.tag(startSeq: start.seq, startMAC: start.mac, throughSeq: through.seq,
                                                            throughMAC: through.mac, key: auditKey))
    }

    /// Up to `limit` export rows after `afterSeq` (whose MAC is `previousMAC`) through
    /// `throughSeq`, in seq order. Each row is checked against the chain as it is read, so the
    /// broker never hands out an export it would not vouch for: `.integrity` at a gap, an
    /// entry whose MAC does not chain, or names that do not open.
    public func auditExportRows(after afterSeq: Int64, previousMAC: [UInt8], through throughSeq: Int64,
                                limit: Int) throws(StoreError) -> [AuditExportRow] {
        var out: [AuditExportRow] = []
        var previous = previousMAC
        var expected = afterSeq + 1
        var broken = false
        do throws(DatabaseError) {
            try db.withStatement("SELECT \(Self.auditColumns) FROM audit WHERE seq > ?1 AND seq <= ?2 ORDER BY seq LIMIT ?3") {
                (s) throws(DatabaseError) in
                try s.bind(1, afterSeq)
                try s.bind(2, throughSeq)
                try s.bind(3, Int64(limit))
                while try s.step() {
                    let row = AuditRow(s)
                    guard row.seq == expected, KeyedHash.equal(chainMAC(previous: previous, seq: row.seq, row.fields), row.mac),
                          let readable = Self.readable(seq: row.seq, row.fields, key: attributeKey) else {
                        broken = true
                        return
                    }
                    out.append(AuditExportRow(seq: row.seq, readable: readable, row: row.fields.rowBytes,
                                              previousMAC: previous, mac: row.mac))
                    previous = row.mac
                    expected += 1
                }
            }
        } catch {
            throw StoreError.from(error)
        }
        // Fewer rows than asked for while the range is not done means one is missing.
        if broken || (out.count < limit && expected <= throughSeq) { throw .integrity }
        return out
    }

    /// A verifier for an export with this header, under this vault's keys.
    public func auditExportVerifier(_ header: AuditExportHeader) -> AuditExportVerifier {
        AuditExportVerifier(header: header, auditKey: auditKey, attributeKey: attributeKey)
    }
}
