import KeyholdCore
/// The TPM rollback counter's value as the vault last recorded it (vault_meta
/// `rollback_counter`), bound to the audit head at that moment and MAC'd under the audit key:
/// a record copied from a newer vault into an older copy names a head the older copy does not
/// have, and an edited one does not verify.
///
/// The item-generation record is tagged to the same audit head, so the two meet through the
/// chain; binding its value here too (a field after the head MAC) would tie them directly.
extension VaultStore {
    /// The recorded counter, or nil when none was ever recorded; `.integrity` when the record
    /// is altered or names an audit head this vault does not have.
    public func recordedRollbackCounter() throws(StoreError) -> UInt64? {
        let stored: [UInt8]?
        do {
            stored = try db.withStatement("SELECT value FROM vault_meta WHERE name = 'rollback_counter'") { (s) throws(DatabaseError) in
                try s.step() ? s.blob(0) : nil
            }
        } catch { throw StoreError.from(error) }
        guard let stored else { return nil }
        guard stored.count > 32 else { throw .integrity }
        let body = Array(stored.dropLast(32)), tag = Array(stored.suffix(32))
        guard KeyedHash.equal(tag, KeyedHash.hash(body, key: auditKey)) else { throw .integrity }
        var d = CanonicalDecoder(body)
        guard d.expect("rollback-counter"), let counter = d.uint64(), let seqBits = d.uint64(),
              let mac = d.field(maxCount: 64), d.isAtEnd else { throw .integrity }
        let seq = Int64(bitPattern: seqBits)
        // The head it was recorded at must be this vault's: not ahead of the head, and the
        // entry (unless pruned) carries the same chain MAC.
        guard seq <= (try authenticatedHeadSequence()) else { throw .integrity }
        let rowMAC: [UInt8]?
        do {
            rowMAC = try db.withStatement("SELECT mac FROM audit WHERE seq = ?1") { (s) throws(DatabaseError) in
                try s.bind(1, seq)
                return try s.step() ? s.blob(0) : nil
            }
        } catch { throw StoreError.from(error) }
        if let rowMAC, !KeyedHash.equal(rowMAC, mac) { throw .integrity }
        return counter
    }

    /// Records `counter` bound to the current audit head.
    public func recordRollbackCounter(_ counter: UInt64) throws(StoreError) {
        do {
            try db.transaction { () throws(DatabaseError) in
                let head = try readHead()
                var e = CanonicalEncoder(domain: "rollback-counter")
                e.append(counter)
                e.append(head?.seq ?? 0)
                e.append(bytes: head?.mac ?? genesisMAC)
                let value = e.bytes + KeyedHash.hash(e.bytes, key: auditKey)
                try db.withStatement("""
                    INSERT INTO vault_meta (name, value) VALUES ('rollback_counter', ?1)
                    ON CONFLICT (name) DO UPDATE SET value = excluded.value
                    """) { (s) throws(DatabaseError) in
                    try s.bind(1, blob: value)
                    try s.step()
                }
            }
        } catch { throw StoreError.from(error) }
    }

    /// Whether an audit entry after `seq` records a change that matters for rollback: an
    /// item removed or replaced (policy changes included), the audit pruned, or a failed
    /// authentication (it counts towards lockout). Reads are not: they cost no counter wear.
    public func rollbackRelevantChange(after seq: Int64) throws(StoreError) -> Bool {
        do {
            return try db.withStatement("""
                SELECT EXISTS (SELECT 1 FROM audit WHERE seq > ?1 AND (
                    (operation IN ('delete', 'update', 'audit-prune', 'accept-rollback') AND outcome = 'ok')
                    OR (decision = 'denied' AND outcome = 'authentication-failed')))
                """) { (s) throws(DatabaseError) in
                try s.bind(1, seq)
                return try s.step() && s.int64(0) != 0
            }
        } catch { throw StoreError.from(error) }
    }
}
