import Glibc
import KeyholdCore

/// The per-uid lockout record, and a lone audit entry committed on its own.
extension VaultStore {
    /// The uid's lockout record; a zero record if there is none.
    public func lockout(uid: UInt32) throws(StoreError) -> LockoutRecord {
        do {
            return try db.withStatement("SELECT failures, level, locked_until_us FROM lockout WHERE uid = ?1") { (s) throws(DatabaseError) in
                try s.bind(1, Int64(uid))
                guard try s.step() else { return LockoutRecord(uid: uid) }
                return LockoutRecord(uid: uid, failures: UInt32(clamping: s.int64(0)), level: UInt32(clamping: s.int64(1)),
                                     lockedUntil: s.int64(2))
            }
        } catch { throw StoreError.from(error) }
    }

    /// Stores the uid's lockout record durably.
    public func setLockout(_ record: LockoutRecord) throws(StoreError) {
        do {
            try db.withStatement("""
                INSERT INTO lockout (uid, failures, level, locked_until_us) VALUES (?1, ?2, ?3, ?4)
                ON CONFLICT (uid) DO UPDATE SET failures = excluded.failures, level = excluded.level,
                    locked_until_us = excluded.locked_until_us
                """) { (s) throws(DatabaseError) in
                try s.bind(1, Int64(record.uid))
                try s.bind(2, Int64(record.failures))
                try s.bind(3, Int64(record.level))
                try s.bind(4, record.lockedUntil)
                try s.step()
            }
        } catch { throw StoreError.from(error) }
    }

    // MARK: Audit

    /// Appends one audit entry, committed durably on return (inside a group commit: with the
    /// group's commit). Any failure is `.auditWriteFailed`.
    public func append(_ audit: AuditRecord) throws(StoreError) {
        try checkAuditSize(audit)
        try db.transaction(mapError: { _ in StoreError.auditWriteFailed }) { () throws(StoreError) in
            try writeAudit(audit)
        }
    }
}
