import KeyholdCore

/// Item generations: an older copy of an item's row does not open.
///
/// Someone who can write `vault.db` but has no key can keep a copy of a row (say while its
/// policy is `none`) and put it back after the owner tightened the policy; every box of that
/// row still opens. So every item carries a generation that grows on each change of its secret
/// or policy, bound into its associated data, and `item_generation` records each item's
/// current generation. That record is authenticated as a whole: `digest` is the XOR of a keyed
/// hash of every (id, generation) pair, updated incrementally, and `tag` binds the digest to
/// the audit head, so the old record cannot be put back with the old row either (unless the
/// audit head and every other item go back too: a whole-vault rollback, which needs an anchor
/// outside the state directory).
///
/// The verified record is kept in memory and re-read whenever another connection committed
/// (`PRAGMA data_version`), so reads cost one pragma and a dictionary lookup.
final class GenerationRecord {
    var generations: [ItemID: UInt64]
    var digest: [UInt8]
    var dataVersion: Int64

    init(generations: [ItemID: UInt64], digest: [UInt8], dataVersion: Int64) {
        self.generations = generations
        self.digest = digest
        self.dataVersion = dataVersion
    }
}

/// What the store knows of the generation record since it last looked.
enum GenerationState {
    case unknown
    case verified(GenerationRecord)
    /// The record does not verify: every item read is `.integrity` until the database changes.
    case broken(dataVersion: Int64)
}

extension VaultStore {
    /// The keyed hash of one (item, generation) pair; the digest is the XOR of these.
    func generationTerm(_ id: ItemID, _ generation: UInt64) -> [UInt8] {
        var e = CanonicalEncoder(domain: "keyhold generation v1")
        e.append(bytes: id.bytes)
        e.append(generation)
        return KeyedHash.hash(e.bytes, key: generationKey)
    }

    func generationHeadTag(digest: [UInt8], auditSeq: Int64, auditMAC: [UInt8]) -> [UInt8] {
        var e = CanonicalEncoder(domain: "generation head")
        e.append(bytes: digest)
        e.append(auditSeq)
        e.append(bytes: auditMAC)
        return KeyedHash.hash(e.bytes, key: generationKey)
    }

    static func xor(_ a: [UInt8], _ b: [UInt8]) -> [UInt8] {
        precondition(a.count == b.count)
        return zip(a, b).map { $0 ^ $1 }
    }

    static let emptyDigest = [UInt8](repeating: 0, count: KeyedHash.byteCount)

    /// The verified generation record. `.integrity` when it does not verify against the audit
    /// head (rows of `item_generation` or its head altered, removed or put back).
    func verifiedGenerations() throws(StoreError) -> GenerationRecord {
        do throws(DatabaseError) {
            let version = try db.dataVersion()
            switch generationState {
            case .verified(let r) where r.dataVersion == version:
                // Inside a group commit a change can be undone after this copy followed it (a
                // member's savepoint or the whole group rolled back): the stored digest then
                // differs, and the record is read again.
                if try storedGenerationDigest() == r.digest { return r }
            case .verified(let r) where isReader:
                // A reader sees each of the writer's commits (every request's audit entry) as
                // another connection's, so re-reading and re-hashing the whole record on each
                // would cost more than the lookup. The same digest, tagged for the current audit
                // head (the key's holder made that tag), names the set the full read verified.
                if try headVouches(for: r.digest) {
                    r.dataVersion = version
                    return r
                }
            case .broken(let v) where v == version: throw DatabaseError.generationMismatch
            default: break
            }
            guard let record = try loadGenerations(dataVersion: version) else {
                generationState = .broken(dataVersion: version)
                throw DatabaseError.generationMismatch
            }
            generationState = .verified(record)
            return record
        } catch {
            throw error == .generationMismatch ? StoreError.integrity : StoreError.from(error)
        }
    }

    private func storedGenerationDigest() throws(DatabaseError) -> [UInt8]? {
        try db.withStatement("SELECT digest FROM item_generation_head WHERE id = 1") { (s) throws(DatabaseError) in
            try s.step() ? s.blob(0) : nil
        }
    }

    /// Whether the stored record's head carries `digest`, tagged for the current audit head.
    private func headVouches(for digest: [UInt8]) throws(DatabaseError) -> Bool {
        let stored: (digest: [UInt8], tag: [UInt8])? = try db.withStatement(
            "SELECT digest, tag FROM item_generation_head WHERE id = 1") { (s) throws(DatabaseError) in
            try s.step() ? (s.blob(0), s.blob(1)) : nil
        }
        guard let stored, let head = try readHead() else { return false }
        return KeyedHash.equal(stored.digest, digest)
            && KeyedHash.equal(stored.tag, generationHeadTag(digest: digest, auditSeq: head.seq, auditMAC: head.mac))
    }

    /// Reads the whole record and checks it; nil if it does not verify.
    private func loadGenerations(dataVersion: Int64) throws(DatabaseError) -> GenerationRecord? {
        var generations: [ItemID: UInt64] = [:]
        var digest = Self.emptyDigest
        var valid = true
        try db.withStatement("SELECT item_id, generation FROM item_generation") { (s) throws(DatabaseError) in
            while try s.step() {
                guard let id = ItemID(bytes: s.blob(0)), let g = UInt64(exactly: s.int64(1)), generations[id] == nil else {
                    valid = false
                    return
                }
                generations[id] = g
                digest = Self.xor(digest, generationTerm(id, g))
            }
        }
        guard valid else { return nil }
        let stored: (digest: [UInt8], tag: [UInt8])? = try db.withStatement(
            "SELECT digest, tag FROM item_generation_head WHERE id = 1") { (s) throws(DatabaseError) in
            try s.step() ? (s.blob(0), s.blob(1)) : nil
        }
        guard let stored, let head = try readHead(),
              KeyedHash.equal(stored.digest, digest),
              KeyedHash.equal(stored.tag, generationHeadTag(digest: digest, auditSeq: head.seq, auditMAC: head.mac))
        else { return nil }
        return GenerationRecord(generations: generations, digest: digest, dataVersion: dataVersion)
    }

    /// `.integrity` unless `generation` (as stored in the row) is the item's current one.
    func checkGeneration(_ id: ItemID, _ generation: Int64, in record: GenerationRecord) throws(StoreError) {
        guard let g = UInt64(exactly: generation), record.generations[id] == g else { throw .integrity }
    }

    /// The digest to tag with a new audit head: the one the caller is committing, else the
    /// verified one; nil when the record does not verify (it is then left as it is, never
    /// re-tagged: re-tagging would vouch for what an attacker wrote). Called before the head moves.
    func digestForNewHead(_ pending: [UInt8]?) throws(DatabaseError) -> [UInt8]? {
        if let pending { return pending }
        do { return try verifiedGenerations().digest } catch {
            switch error {
            case .integrity: return nil
            case .io(let code): throw DatabaseError(code: code)
            default: throw DatabaseError(code: 1)
            }
        }
    }

    func writeGenerationHead(digest: [UInt8], auditSeq: Int64, auditMAC: [UInt8]) throws(DatabaseError) {
        try db.withStatement("""
            INSERT INTO item_generation_head (id, digest, tag) VALUES (1, ?1, ?2)
            ON CONFLICT (id) DO UPDATE SET digest = excluded.digest, tag = excluded.tag
            """) { (s) throws(DatabaseError) in
            try s.bind(1, blob: digest)
            try s.bind(2, blob: generationHeadTag(digest: digest, auditSeq: auditSeq, auditMAC: auditMAC))
            try s.step()
        }
    }

    /// Records `generation` as the item's current one (nil: the item is gone), inside the
    /// caller's transaction. Returns the new digest, for `writeAudit(_:generationDigest:)`.
    func setGeneration(_ id: ItemID, from old: UInt64?, to new: UInt64?, digest: [UInt8]) throws(DatabaseError) -> [UInt8] {
        var digest = digest
        if let old { digest = Self.xor(digest, generationTerm(id, old)) }
        if let new {
            digest = Self.xor(digest, generationTerm(id, new))
            try db.withStatement("""
                INSERT INTO item_generation (item_id, generation) VALUES (?1, ?2)
                ON CONFLICT (item_id) DO UPDATE SET generation = excluded.generation
                """) { (s) throws(DatabaseError) in
                try s.bind(1, blob: id.bytes)
                try s.bind(2, Int64(bitPattern: new))
                try s.step()
            }
        } else {
            try db.withStatement("DELETE FROM item_generation WHERE item_id = ?1") { (s) throws(DatabaseError) in
                try s.bind(1, blob: id.bytes)
                try s.step()
            }
        }
        return digest
    }

    /// After a committed change: the in-memory record follows what was written.
    func commitGeneration(_ id: ItemID, _ new: UInt64?, digest: [UInt8], record: GenerationRecord) {
        record.generations[id] = new
        record.digest = digest
    }

    /// First open after migration 2: tag the record the migration filled (every existing item
    /// at generation 0) with the current audit head.
    func initialiseGenerationHead() throws(StoreError) {
        do {
            try db.transaction { () throws(DatabaseError) in
                var digest = Self.emptyDigest
                try db.withStatement("SELECT item_id, generation FROM item_generation") { (s) throws(DatabaseError) in
                    while try s.step() {
                        guard let id = ItemID(bytes: s.blob(0)), let g = UInt64(exactly: s.int64(1)) else { continue }
                        digest = Self.xor(digest, generationTerm(id, g))
                    }
                }
                guard let head = try readHead() else { return }
                try writeGenerationHead(digest: digest, auditSeq: head.seq, auditMAC: head.mac)
            }
        } catch { throw StoreError.from(error) }
        generationState = .unknown
    }

    /// The generation stored in the item row with this id and owner; nil if there is none.
    func storedGeneration(id: ItemID, owner: UInt32) throws(DatabaseError) -> Int64? {
        try db.withStatement("SELECT generation FROM items WHERE id = ?1 AND owner_uid = ?2") { (s) throws(DatabaseError) in
            try s.bind(1, blob: id.bytes)
            try s.bind(2, Int64(owner))
            return try s.step() ? s.int64(0) : nil
        }
    }
}

extension DatabaseError {
    /// Internal marker (not an SQLite code): the generation record did not verify.
    static let generationMismatch = DatabaseError(code: -2)
}
