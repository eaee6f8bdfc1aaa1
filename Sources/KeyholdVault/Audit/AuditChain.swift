import KeyholdCore

/// The audit chain: each row's `mac = BLAKE2b_auditKey(prev_mac ‖ canonical row incl. seq)`,
/// an `entry_tag` over the row without its seq (to tell a moved row from an edited one), and
/// a tagged head (seq, mac) updated in the same transaction, so deleting the newest rows is
/// detected as well.
extension VaultStore {
    /// The chain's starting value, before the first entry.
    var genesisMAC: [UInt8] { Self.genesisMAC(key: auditKey) }

    /// Static forms take the key, so an export verifier can run without the store (and its lock).
    static func genesisMAC(key: AuditKey) -> [UInt8] { KeyedHash.hash(Array("keyhold audit genesis v1".utf8), key: key) }

    /// Stored audit fields, as bytes exactly as in the row, so verification re-encodes what is
    /// on disk rather than a decoded copy.
    struct AuditFields {
        var time: Int64
        var uid: Int64
        var pid: Int64
        var executable: [UInt8]
        var operation: [UInt8]
        var itemID: [UInt8]?
        var details: [UInt8]?
        var decision: [UInt8]
        var method: [UInt8]
        var outcome: [UInt8]

        func encode(into e: inout CanonicalEncoder) {
            e.append(time); e.append(uid); e.append(pid)
            e.append(bytes: executable); e.append(bytes: operation)
            e.append(optionalBytes: itemID); e.append(optionalBytes: details)
            e.append(bytes: decision); e.append(bytes: method); e.append(bytes: outcome)
        }
    }

    func entryTag(_ f: AuditFields) -> [UInt8] {
        var e = CanonicalEncoder(domain: "keyhold audit entry v1")
        f.encode(into: &e)
        return KeyedHash.hash(e.bytes, key: auditKey)
    }

    func chainMAC(previous: [UInt8], seq: Int64, _ f: AuditFields) -> [UInt8] {
        Self.chainMAC(previous: previous, seq: seq, f, key: auditKey)
    }

    static func chainMAC(previous: [UInt8], seq: Int64, _ f: AuditFields, key: AuditKey) -> [UInt8] {
        var e = CanonicalEncoder(domain: "keyhold audit mac v1")
        e.append(bytes: previous)
        e.append(seq)
        f.encode(into: &e)
        return KeyedHash.hash(e.bytes, key: key)
    }

    func headTag(seq: Int64, mac: [UInt8]) -> [UInt8] {
        var e = CanonicalEncoder(domain: "head")
        e.append(seq)
        e.append(bytes: mac)
        return KeyedHash.hash(e.bytes, key: auditKey)
    }

    func checkpointTag(seq: Int64, mac: [UInt8]) -> [UInt8] {
        var e = CanonicalEncoder(domain: "checkpoint")
        e.append(seq)
        e.append(bytes: mac)
        return KeyedHash.hash(e.bytes, key: auditKey)
    }

    static func detailsAD(seq: Int64) -> [UInt8] {
        var e = CanonicalEncoder(domain: "keyhold audit details v1")
        e.append(seq)
        return e.bytes
    }

    /// The sealed names of entry `seq` (service, account, reason), opened under the attribute
    /// key; nil when the box does not open under this entry's number or does not decode.
    static func openDetails(seq: Int64, _ raw: [UInt8], key: AttributeKey) -> (service: String?, account: String?, reason: String?)? {
        guard let box = try? SealedBox(combined: raw),
              let plain = try? box.openAttributes(using: key, authenticating: detailsAD(seq: seq)) else { return nil }
        var d = CanonicalDecoder(plain)
        guard d.expect("details"), let service = d.optionalText(), let account = d.optionalText(),
              let reason = d.optionalText(), d.isAtEnd else { return nil }
        return (service, account, reason)
    }

    /// Moves the audit head and re-tags the generation record with it (see
    /// VaultStore+Generation): `generationDigest` is the digest an item change is committing.
    func writeHead(seq: Int64, mac: [UInt8], generationDigest: [UInt8]? = nil) throws(DatabaseError) {
        // Decided before the head moves: the record is verified against the current head.
        let digest = try digestForNewHead(generationDigest)
        try db.withStatement("""
            INSERT INTO audit_head (id, seq, mac, head_tag) VALUES (1, ?1, ?2, ?3)
            ON CONFLICT (id) DO UPDATE SET seq = excluded.seq, mac = excluded.mac, head_tag = excluded.head_tag
            """) { (s) throws(DatabaseError) in
            try s.bind(1, seq)
            try s.bind(2, blob: mac)
            try s.bind(3, blob: headTag(seq: seq, mac: mac))
            try s.step()
        }
        if let digest { try writeGenerationHead(digest: digest, auditSeq: seq, auditMAC: mac) }
    }

    struct Head { var seq: Int64; var mac: [UInt8]; var tag: [UInt8] }

    /// The newest stored entry's seq and MAC (where the chain continues when the head row is gone).
    func newestEntry() throws(DatabaseError) -> (seq: Int64, mac: [UInt8])? {
        try db.withStatement("SELECT seq, mac FROM audit ORDER BY seq DESC LIMIT 1") { (s) throws(DatabaseError) in
            try s.step() ? (s.int64(0), s.blob(1)) : nil
        }
    }

    func readHead() throws(DatabaseError) -> Head? {
        try db.withStatement("SELECT seq, mac, head_tag FROM audit_head WHERE id = 1") { (s) throws(DatabaseError) in
            try s.step() ? Head(seq: s.int64(0), mac: s.blob(1), tag: s.blob(2)) : nil
        }
    }

    func readCheckpoint() throws(DatabaseError) -> Head? {
        try db.withStatement("SELECT seq, mac, checkpoint_tag FROM audit_checkpoint WHERE id = 1") { (s) throws(DatabaseError) in
            try s.step() ? Head(seq: s.int64(0), mac: s.blob(1), tag: s.blob(2)) : nil
        }
    }

    /// Writes one entry and moves the head, inside the caller's transaction. Any failure is
    /// `.auditWriteFailed`, which makes the caller's transaction roll back.
    func writeAudit(_ r: AuditRecord, generationDigest: [UInt8]? = nil) throws(StoreError) {
        do {
            // Continue from the head; if the head row was removed, from the newest row, so the
            // log keeps growing and `verifyAudit` reports the damage.
            var previous: (seq: Int64, mac: [UInt8])
            if let head = try readHead() {
                previous = (head.seq, head.mac)
            } else {
                previous = try newestEntry() ?? (0, genesisMAC)
            }
            let seq = previous.seq + 1
            var details: [UInt8]?
            if r.service != nil || r.account != nil || r.reason != nil {
                var e = CanonicalEncoder(domain: "details")
                e.append(optional: r.service)
                e.append(optional: r.account)
                e.append(optional: r.reason)
                details = e.bytes.withUnsafeBytes {
                    SealedBox.seal($0, using: attributeKey, authenticating: Self.detailsAD(seq: seq))
                }.combined
            }
            let fields = AuditFields(time: r.time, uid: Int64(r.callerUID), pid: Int64(r.callerPID),
                                     executable: Array(r.executable.utf8), operation: Array(r.operation.rawValue.utf8),
                                     itemID: r.itemID?.bytes, details: details, decision: Array(r.decision.rawValue.utf8),
                                     method: Array(r.method.description.utf8), outcome: Array(r.outcome.name.utf8))
            let mac = chainMAC(previous: previous.mac, seq: seq, fields)
            try db.withStatement("""
                INSERT INTO audit (seq, time_us, caller_uid, caller_pid, executable, operation, item_id, details,
                    decision, method, outcome, entry_tag, mac)
                VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)
                """) { (s) throws(DatabaseError) in
                try s.bind(1, seq)
                try s.bind(2, fields.time)
                try s.bind(3, fields.uid)
                try s.bind(4, fields.pid)
                try s.bind(5, text: r.executable)
                try s.bind(6, text: r.operation.rawValue)
                try s.bind(7, blob: fields.itemID)
                try s.bind(8, blob: fields.details)
                try s.bind(9, text: r.decision.rawValue)
                try s.bind(10, text: r.method.description)
                try s.bind(11, text: r.outcome.name)
                try s.bind(12, blob: entryTag(fields))
                try s.bind(13, blob: mac)
                try s.step()
            }
            try writeHead(seq: seq, mac: mac, generationDigest: generationDigest)
        } catch {
            throw .auditWriteFailed
        }
    }

    static let auditColumns = "seq, time_us, caller_uid, caller_pid, executable, operation, item_id, details, decision, method, outcome, entry_tag, mac"

    struct AuditRow {
        var seq: Int64
        var fields: AuditFields
        var tag: [UInt8]
        var mac: [UInt8]

        init(_ s: Statement) {
            seq = s.int64(0)
            // Text columns are read as their stored bytes (blob() on TEXT returns them as is).
            fields = AuditFields(time: s.int64(1), uid: s.int64(2), pid: s.int64(3), executable: s.blob(4),
                                 operation: s.blob(5), itemID: s.optionalBlob(6), details: s.optionalBlob(7),
                                 decision: s.blob(8), method: s.blob(9), outcome: s.blob(10))
            tag = s.blob(11)
            mac = s.blob(12)
        }
    }

    private func auditRow(seq: Int64) throws(DatabaseError) -> AuditRow? {
        try db.withStatement("SELECT \(Self.auditColumns) FROM audit WHERE seq = ?1") { (s) throws(DatabaseError) in
            try s.bind(1, seq)
            return try s.step() ? AuditRow(s) : nil
        }
    }

    /// Checks the whole chain in one streamed pass: `.intact(count:)`, or the first entry that
    /// is wrong and whether it was altered, removed, inserted, reordered, or the tail truncated.
    public func verifyAudit() throws(StoreError) -> AuditVerification {
        do {
            var start: (seq: Int64, mac: [UInt8]) = (0, genesisMAC)
            if let cp = try readCheckpoint() {
                guard KeyedHash.equal(cp.tag, checkpointTag(seq: cp.seq, mac: cp.mac)) else {
                    return .broken(seq: cp.seq + 1, problem: .altered)
                }
                start = (cp.seq, cp.mac)
            }
            let head = try readHead()
            let headValid = head.map { KeyedHash.equal($0.tag, headTag(seq: $0.seq, mac: $0.mac)) } ?? false

            var expected = start.seq + 1
            var previous = start.mac
            var count: Int64 = 0
            var failed: AuditRow?
            var missing: Int64?
            try db.withStatement("SELECT \(Self.auditColumns) FROM audit WHERE seq > ?1 ORDER BY seq") { (s) throws(DatabaseError) in
                try s.bind(1, start.seq)
                while try s.step() {
                    let row = AuditRow(s)
                    guard row.seq == expected else { missing = expected; return }
                    let computed = chainMAC(previous: previous, seq: row.seq, row.fields)
                    guard KeyedHash.equal(computed, row.mac), KeyedHash.equal(entryTag(row.fields), row.tag) else {
                        failed = row
                        return
                    }
                    previous = row.mac
                    expected += 1
                    count += 1
                }
            }
            if let missing { return .broken(seq: missing, problem: .removed) }
            if let row = failed {
                return .broken(seq: row.seq, problem: try classify(row, previous: previous,
                                                                   head: headValid ? head : nil))
            }
            let last = expected - 1
            guard let head, headValid else {
                // The head no longer vouches for the chain (forged, fixed up, or removed).
                return .broken(seq: last + 1, problem: .truncatedTail)
            }
            if head.seq > last { return .broken(seq: last + 1, problem: .truncatedTail) }
            if head.seq < last { return .broken(seq: head.seq + 1, problem: .inserted) }
            guard KeyedHash.equal(head.mac, previous) else { return .broken(seq: last, problem: .altered) }
            return .intact(count: count)
        } catch {
            throw .io(code: error.code)
        }
    }

    /// Names what happened at the first bad row, by looking at the row after it.
    private func classify(_ row: AuditRow, previous: [UInt8], head: Head?) throws(DatabaseError) -> AuditProblem {
        let next = try auditRow(seq: row.seq + 1)
        // The next row belongs at this seq: this row was slipped in and the rest pushed down.
        let genuine = KeyedHash.equal(entryTag(row.fields), row.tag)
        if let next, KeyedHash.equal(chainMAC(previous: previous, seq: row.seq, next.fields), next.mac) {
            // …unless this row is genuine and belongs right after it: two neighbours swapped.
            if genuine, KeyedHash.equal(chainMAC(previous: next.mac, seq: next.seq, row.fields), row.mac) {
                return .reordered
            }
            return .inserted
        }
        if !genuine {
            // Beyond what the head vouches for: appended by someone without the key.
            if let head, row.seq > head.seq { return .inserted }
            return .altered
        }
        // Genuine content: either only its MAC was edited (the chain resumes from the true MAC)
        // or it was moved here from another position.
        let computed = chainMAC(previous: previous, seq: row.seq, row.fields)
        if let next, KeyedHash.equal(chainMAC(previous: computed, seq: next.seq, next.fields), next.mac) {
            return .altered
        }
        if next == nil, let head, head.seq == row.seq, KeyedHash.equal(head.mac, computed) { return .altered }
        return .reordered
    }

    /// Removes the entries up to and including `throughSeq` (after the caller exported them)
    /// and leaves a tagged checkpoint (that seq and its MAC), so the rest of the chain still
    /// verifies from there. `audit` (the prune request's own entry) is written in the same
    /// transaction. Returns how many entries were removed. Never called automatically.
    /// `.notFound` if `throughSeq` is not an existing entry.
    @discardableResult
    public func pruneAudit(throughSeq: Int64, audit: AuditRecord) throws(StoreError) -> Int64 {
        try checkAuditSize(audit)
        return try db.transaction(mapError: { _ in StoreError.auditWriteFailed }) { () throws(StoreError) -> Int64 in
            let removed: Int64
            do throws(DatabaseError) {
                guard let row = try auditRow(seq: throughSeq) else { throw DatabaseError(code: 12 /* SQLITE_NOTFOUND */) }
                removed = try db.withStatement("DELETE FROM audit WHERE seq <= ?1") { (s) throws(DatabaseError) -> Int64 in
                    try s.bind(1, throughSeq)
                    try s.step()
                    return Int64(db.changes)
                }
                try db.withStatement("""
                    INSERT INTO audit_checkpoint (id, seq, mac, checkpoint_tag) VALUES (1, ?1, ?2, ?3)
                    ON CONFLICT (id) DO UPDATE SET seq = excluded.seq, mac = excluded.mac, checkpoint_tag = excluded.checkpoint_tag
                    """) { (s) throws(DatabaseError) in
                    try s.bind(1, throughSeq)
                    try s.bind(2, blob: row.mac)
                    try s.bind(3, blob: checkpointTag(seq: throughSeq, mac: row.mac))
                    try s.step()
                }
            } catch {
                throw error.code == 12 ? StoreError.notFound : StoreError.from(error)
            }
            try writeAudit(audit)
            return removed
        }
    }
}

extension VaultStore {
    /// The newest entry written at or before `time` (µs since the epoch), for `prune --until`.
    public func lastAuditSeq(atOrBefore time: Int64) throws(StoreError) -> Int64? {
        do throws(DatabaseError) {
            return try db.withStatement("SELECT max(seq) FROM audit WHERE time_us <= ?1") { (s) throws(DatabaseError) -> Int64? in
                try s.bind(1, time)
                guard try s.step(), !s.isNull(0) else { return nil }
                return s.int64(0)
            }
        } catch {
            throw StoreError.from(error)
        }
    }
}
