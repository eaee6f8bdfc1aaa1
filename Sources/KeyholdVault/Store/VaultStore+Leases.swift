import KeyholdCore

/// Rotation leases that outlive a connection or the broker (issue 36 item 1): the broker writes
/// a row when it releases a secret for a rotation (in the release's transaction), and removes
/// it with the rotation's commit or cancel. A row left behind means a COMMAND that received
/// the old secret may still be running until `until` (wall clock, µs): no other rotation of
/// the item starts before then, restart or not.
extension VaultStore {
    /// Records that `item` is leased until `until` (replacing any older row).
    public func recordRotationLease(_ item: ItemID, until: Int64) throws(StoreError) {
        do {
            try db.withStatement("""
                INSERT INTO rotation_leases (item_id, until_us) VALUES (?1, ?2)
                ON CONFLICT (item_id) DO UPDATE SET until_us = excluded.until_us
                """) { (s) throws(DatabaseError) in
                try s.bind(1, blob: item.bytes)
                try s.bind(2, until)
                try s.step()
            }
        } catch { throw StoreError.from(error) }
    }

    /// When `item`'s recorded lease ends, or nil when none is recorded.
    public func rotationLease(_ item: ItemID) throws(StoreError) -> Int64? {
        do {
            return try db.withStatement("SELECT until_us FROM rotation_leases WHERE item_id = ?1") { (s) throws(DatabaseError) in
                try s.bind(1, blob: item.bytes)
                return try s.step() ? s.int64(0) : nil
            }
        } catch { throw StoreError.from(error) }
    }

    /// Forgets `item`'s recorded lease (its rotation committed or was canceled).
    public func clearRotationLease(_ item: ItemID) throws(StoreError) {
        do {
            try db.withStatement("DELETE FROM rotation_leases WHERE item_id = ?1") { (s) throws(DatabaseError) in
                try s.bind(1, blob: item.bytes)
                try s.step()
            }
        } catch { throw StoreError.from(error) }
    }
}
