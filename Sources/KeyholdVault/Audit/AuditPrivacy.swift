/// What `keyhold audit verify` tells a caller: root, the log's entry count and the first bad
/// entry; a user, their own entry count, and the first bad entry only when it is theirs,
/// numbered among their own.
public struct AuditVerifyAnswer: Sendable {
    public let verification: AuditVerification
    public let count: Int64
    public let firstBad: Int64?
}

/// What a non-root user learns from the audit log: their own entries only, numbered among
/// their own (issue 8, item 9). The chain is still checked over every entry.
extension VaultStore {
    /// Checks the whole chain, answered as `visibleTo` may see it (nil: root).
    public func verifyAudit(visibleTo uid: UInt32?) throws(StoreError) -> AuditVerifyAnswer {
        let v = try verifyAudit()
        guard let uid else {
            switch v {
            case .intact(let n): return AuditVerifyAnswer(verification: v, count: n, firstBad: nil)
            case .broken(let seq, _): return AuditVerifyAnswer(verification: v, count: 0, firstBad: seq)
            }
        }
        var own: Int64?
        if case .broken(let seq, _) = v { own = try auditOwnSeq(uid: uid, seq: seq) }
        return AuditVerifyAnswer(verification: v, count: try auditEntryCount(uid: uid), firstBad: own)
    }

    /// How many entries of `uid` the log holds (since the last prune).
    func auditEntryCount(uid: UInt32) throws(StoreError) -> Int64 {
        do throws(DatabaseError) {
            return try db.withStatement("SELECT count(*) FROM audit WHERE caller_uid = ?1") { (s) throws(DatabaseError) -> Int64 in
                try s.bind(1, Int64(uid))
                return try s.step() ? s.int64(0) : 0
            }
        } catch { throw StoreError.from(error) }
    }

    /// The entry at `seq` as numbered among `uid`'s own entries; nil when it is not theirs
    /// (or is gone), so a failed check of another user's entry does not say where it is.
    func auditOwnSeq(uid: UInt32, seq: Int64) throws(StoreError) -> Int64? {
        do throws(DatabaseError) {
            let owner: Int64? = try db.withStatement("SELECT caller_uid FROM audit WHERE seq = ?1") { (s) throws(DatabaseError) -> Int64? in
                try s.bind(1, seq)
                return try s.step() ? s.int64(0) : nil
            }
            guard owner == Int64(uid) else { return nil }
            return try db.withStatement("SELECT count(*) FROM audit WHERE caller_uid = ?1 AND seq <= ?2") { (s) throws(DatabaseError) -> Int64 in
                try s.bind(1, Int64(uid))
                try s.bind(2, seq)
                return try s.step() ? s.int64(0) : 0
            }
        } catch { throw StoreError.from(error) }
    }

    /// The global seq of `uid`'s `own`-th entry (for a caller resuming after its own number);
    /// the newest seq of the log when it has fewer, so nothing older is sent again.
    public func auditSeq(uid: UInt32, own: Int64) throws(StoreError) -> Int64 {
        guard own > 0 else { return Int64.min }
        do throws(DatabaseError) {
            let found: Int64? = try db.withStatement(
                "SELECT seq FROM audit WHERE caller_uid = ?1 ORDER BY seq LIMIT 1 OFFSET ?2") { (s) throws(DatabaseError) -> Int64? in
                try s.bind(1, Int64(uid))
                try s.bind(2, own - 1)
                return try s.step() ? s.int64(0) : nil
            }
            if let found { return found }
            return try db.withStatement("SELECT coalesce(max(seq), 0) FROM audit") { (s) throws(DatabaseError) -> Int64 in
                try s.step() ? s.int64(0) : 0
            }
        } catch { throw StoreError.from(error) }
    }
}
