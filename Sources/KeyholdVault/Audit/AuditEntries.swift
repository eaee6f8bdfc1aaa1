import KeyholdCore

/// Reading the audit log for display (`keyhold audit`): entries decrypted, numbered for their
/// reader, and shown even when altered (`verifyAudit` says where).
extension VaultStore {
    /// Decrypted audit entries in seq order. `visibleTo`: nil (root) sees all, a uid sees the
    /// entries of its own requests. `since`: µs since the epoch; `afterSeq`: for following.
    /// `ownAfter`: the user's own number of their entry at `afterSeq` (the last one sent), so
    /// the numbering goes on from it without reading all of their older entries again (each
    /// page, and each poll of a follow, would otherwise scan the whole log).
    public func auditEntries(visibleTo uid: UInt32?, since: Int64? = nil, item: (service: String, account: String)? = nil,
                             afterSeq: Int64? = nil, ownAfter: Int64? = nil, limit: Int? = nil) throws(StoreError) -> [AuditEntryView] {
        var out: [AuditEntryView] = []
        // A user's entries are also numbered among their own (row_number over all of theirs,
        // whatever the filters), so what they see reveals nothing of others' activity.
        let continued = uid != nil && afterSeq != nil && ownAfter != nil
        let sql = uid == nil ? """
            SELECT \(Self.auditColumns), NULL FROM audit
            WHERE (?1 IS NULL OR caller_uid = ?1) AND time_us >= ?2 AND seq > ?3 ORDER BY seq
            """ : continued ? """
            SELECT \(Self.auditColumns), own FROM (
                SELECT \(Self.auditColumns), ?4 + row_number() OVER (ORDER BY seq) AS own FROM audit WHERE caller_uid = ?1 AND seq > ?3)
            WHERE time_us >= ?2 ORDER BY seq
            """ : """
            SELECT \(Self.auditColumns), own FROM (
                SELECT \(Self.auditColumns), row_number() OVER (ORDER BY seq) AS own FROM audit WHERE caller_uid = ?1)
            WHERE time_us >= ?2 AND seq > ?3 ORDER BY seq
            """
        do {
            try db.withStatement(sql) { (s) throws(DatabaseError) in
                if let uid { try s.bind(1, Int64(uid)) } else { try s.bindNull(1) }
                try s.bind(2, since ?? Int64.min)
                try s.bind(3, afterSeq ?? Int64.min)
                if continued, let ownAfter { try s.bind(4, ownAfter) }
                while try s.step() {
                    let row = AuditRow(s)
                    let own = s.isNull(13) ? nil : s.int64(13)
                    // Shown even when altered (`audit verify` says where): names that do not
                    // open are left out and the entry marked (nil), stored text is shown as it
                    // decodes. An entry without sealed names has none to open.
                    let names: (service: String?, account: String?, reason: String?)?
                    if let raw = row.fields.details {
                        names = Self.openDetails(seq: row.seq, raw, key: attributeKey)
                    } else {
                        names = (nil, nil, nil)
                    }
                    if let item, names?.service != item.service || names?.account != item.account { continue }
                    let f = row.fields
                    func text(_ b: [UInt8]) -> String { String(decoding: b, as: UTF8.self) }
                    let readable = AuditReadableFields(
                        time: f.time, callerUID: UInt32(truncatingIfNeeded: f.uid), callerPID: Int32(truncatingIfNeeded: f.pid),
                        executable: text(f.executable), operation: text(f.operation),
                        itemID: f.itemID.flatMap { ItemID(bytes: $0) }?.description,
                        service: names?.service, account: names?.account, decision: text(f.decision),
                        method: text(f.method), reason: names?.reason, outcome: text(f.outcome))
                    out.append(AuditEntryView(seq: row.seq, readable: readable, mac: row.mac,
                                              detailsIntact: names != nil, ownSeq: own))
                    if let limit, out.count >= limit { return }
                }
            }
        } catch { throw .io(code: error.code) }
        return out
    }
}
