import KeyholdCore

/// A new vault key for the whole vault (`--migrate-key-protector tpm`, issue 36 item 2): a key
/// file kept from before the move to the TPM must open nothing written after it, and must not
/// vouch for anything either (the protector record, the rollback counter record, the audit).
///
/// Everything derived from the vault key is redone in ONE transaction, so the database is
/// entirely under the old key or entirely under the new one, whatever kills the process:
/// - items: attributes re-sealed, item keys re-wrapped (an app-password item's inner box is
///   left as it is: only its outer layer is under the vault key), blind index recomputed (a
///   lookup by name keeps working under the new key); the secrets' boxes are under the item
///   keys and stay as they are;
/// - the search index and the generation record, re-tagged;
/// - the audit chain, re-MAC'd entry by entry with its sealed names re-sealed, the head and the
///   checkpoint re-tagged (a pruned chain keeps its checkpoint MAC as its starting value);
/// - `key_check`, the protector record; the rollback counter record is dropped (it is bound to
///   the old audit key; the counter is made again for the new key, `ProtectorRecord.pending`).
///
/// Only a vault that verifies is re-keyed: re-MACing a chain or record that does not verify
/// would vouch for what someone without the key wrote. Audit exports made before verify only
/// against the old key.
extension VaultStore {
    /// Re-keys this vault to `newKey`, with `audit` (the migration's entry) written first in the
    /// same transaction. The store is closed afterwards: open it again with `newKey`.
    public func rekey(to newKey: VaultKey, record: ProtectorRecord, audit: AuditRecord) throws(StoreError) {
        guard case .intact = try verifyAudit() else { throw .integrity }
        let generations = try verifiedGenerations()
        let scratch: Database
        do { scratch = try Database(path: ":memory:", create: true) } catch { throw StoreError.from(error) }
        // The new keys' hashes and boxes, from the store's own functions; it never reads or
        // writes a vault (its connection is an empty in-memory database).
        let target = VaultStore(reader: ReaderSeed(
            wrappingKey: newKey.wrappingKey, attributeKey: newKey.attributeKey, blindIndexKey: newKey.blindIndexKey,
            auditKey: newKey.auditKey, generationKey: newKey.generationKey, searchKey: newKey.searchKey, fileIdentities: [],
            stateDirectory: stateDirectory, passwordHashing: passwordHashing), db: scratch)
        try checkAuditSize(audit)
        try db.transaction(mapError: { StoreError.from($0) }) { () throws(StoreError) in
            try writeAudit(audit)
            try rekeyItems(target, generations)
            do throws(DatabaseError) {
                let head = try rekeyAudit(target)
                var digest = Self.emptyDigest
                try db.withStatement("SELECT item_id, generation FROM item_generation") { (s) throws(DatabaseError) in
                    while try s.step() {
                        guard let id = ItemID(bytes: s.blob(0)), let g = UInt64(exactly: s.int64(1)) else { throw .generationMismatch }
                        digest = Self.xor(digest, target.generationTerm(id, g))
                    }
                }
                try db.withStatement("UPDATE item_generation_head SET digest = ?1, tag = ?2 WHERE id = 1") { (s) throws(DatabaseError) in
                    try s.bind(1, blob: digest)
                    try s.bind(2, blob: target.generationHeadTag(digest: digest, auditSeq: head.seq, auditMAC: head.mac))
                    try s.step()
                }
                try db.withStatement("UPDATE vault_meta SET value = ?1 WHERE name = 'key_check'") { (s) throws(DatabaseError) in
                    try s.bind(1, blob: Self.keyCheckValue(newKey))
                    try s.step()
                }
                try db.execute("DELETE FROM vault_meta WHERE name = 'rollback_counter'")
                try target.writeProtectorRow(record, into: db)
            } catch {
                throw error == .generationMismatch ? StoreError.integrity : StoreError.from(error)
            }
        }
        close()
    }

    /// Every item: its names and wrapped key opened under the old keys and sealed under the
    /// new ones (same associated data), its blind index and search tags recomputed.
    private func rekeyItems(_ target: VaultStore, _ generations: GenerationRecord) throws(StoreError) {
        var rows: [(ItemRow, [UInt8])] = []
        try mapped { () throws(DatabaseError) in
            try db.withStatement("SELECT \(Self.itemColumns), wrapped_key FROM items ORDER BY rowid") { (s) throws(DatabaseError) in
                while try s.step() { rows.append((ItemRow(s), s.blob(Self.columnAfterItem))) }
            }
            try db.execute("DELETE FROM item_search")
        }
        for (row, wrapped) in rows {
            let item = try decode(row, generations: generations)
            let ad = item.associatedData
            let itemKey: SecureBytes
            do {
                itemKey = try SealedBox(combined: wrapped).open(using: wrappingKey, authenticating: ad.encoded(for: .wrappedKey))
            } catch { throw .integrity }
            var names = CanonicalEncoder(domain: "attributes")
            names.append(item.service)
            names.append(item.account)
            names.append(item.label)
            let attributes = SealedBox.seal(names.bytes, using: target.attributeKey, authenticating: ad.encoded(for: .attributes))
            let rewrapped = SealedBox.seal(itemKey, using: target.wrappingKey, authenticating: ad.encoded(for: .wrappedKey))
            let lookup = BlindIndex(key: target.blindIndexKey, owner: item.owner, service: item.service, account: item.account)
            try mapped { () throws(DatabaseError) in
                try db.withStatement("UPDATE items SET lookup = ?2, attributes = ?3, wrapped_key = ?4 WHERE id = ?1") { (s) throws(DatabaseError) in
                    try s.bind(1, blob: row.id)
                    try s.bind(2, blob: lookup.bytes)
                    try s.bind(3, blob: attributes.combined)
                    try s.bind(4, blob: rewrapped.combined)
                    try s.step()
                }
                for (key, value) in AttributeMap.attributes(service: item.service, account: item.account) {
                    try db.withStatement("INSERT INTO item_search (item_id, tag) VALUES (?1, ?2)") { (s) throws(DatabaseError) in
                        try s.bind(1, blob: row.id)
                        try s.bind(2, blob: target.searchTag(owner: item.owner, key: key, value: value))
                        try s.step()
                    }
                }
            }
        }
    }

    /// The whole chain under the new audit key (names re-sealed under the new attribute key),
    /// from the checkpoint or the new genesis value; returns the new head.
    private func rekeyAudit(_ target: VaultStore) throws(DatabaseError) -> (seq: Int64, mac: [UInt8]) {
        var previous = target.genesisMAC
        var last: Int64 = 0
        if let cp = try readCheckpoint() {
            previous = cp.mac
            last = cp.seq
            try db.withStatement("UPDATE audit_checkpoint SET checkpoint_tag = ?1 WHERE id = 1") { (s) throws(DatabaseError) in
                try s.bind(1, blob: target.checkpointTag(seq: cp.seq, mac: cp.mac))
                try s.step()
            }
        }
        var rows: [AuditRow] = []
        try db.withStatement("SELECT \(Self.auditColumns) FROM audit ORDER BY seq") { (s) throws(DatabaseError) in
            while try s.step() { rows.append(AuditRow(s)) }
        }
        for var row in rows {
            if let details = row.fields.details {
                guard let box = try? SealedBox(combined: details),
                      let plain = try? box.open(using: attributeKey, authenticating: Self.detailsAD(seq: row.seq)) else {
                    throw .generationMismatch  // a sealed name that does not open: not vouched for
                }
                row.fields.details = SealedBox.seal(plain, using: target.attributeKey, authenticating: Self.detailsAD(seq: row.seq)).combined
            }
            let mac = target.chainMAC(previous: previous, seq: row.seq, row.fields)
            try db.withStatement("UPDATE audit SET details = ?2, entry_tag = ?3, mac = ?4 WHERE seq = ?1") { (s) throws(DatabaseError) in
                try s.bind(1, row.seq)
                try s.bind(2, blob: row.fields.details)
                try s.bind(3, blob: target.entryTag(row.fields))
                try s.bind(4, blob: mac)
                try s.step()
            }
            previous = mac
            last = row.seq
        }
        try db.withStatement("UPDATE audit_head SET seq = ?1, mac = ?2, head_tag = ?3 WHERE id = 1") { (s) throws(DatabaseError) in
            try s.bind(1, last)
            try s.bind(2, blob: previous)
            try s.bind(3, blob: target.headTag(seq: last, mac: previous))
            try s.step()
        }
        return (last, previous)
    }
}
