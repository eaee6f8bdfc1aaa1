import KeyholdCore

/// Group commit support: the broker runs several callers' store calls inside one outer
/// transaction, each call as a nested transaction, and commits them with one fsync.
extension VaultStore {
    /// Runs `body` inside one outer transaction and commits it. Every store call `body` makes
    /// is a nested transaction that undoes only itself when it fails. Returns false when the
    /// COMMIT failed: then nothing `body` wrote is stored, and the caller must release nothing.
    public func groupTransaction(_ body: () -> Void) -> Bool {
        db.groupTransaction { () -> Bool in
            body()
            return true
        }
    }

    /// One member of a group: its writes land together or not at all. Outside a group this
    /// is an ordinary transaction committed on return.
    public func memberTransaction<R>(_ body: () throws(StoreError) -> R) throws(StoreError) -> R {
        try db.transaction(mapError: { _ in StoreError.auditWriteFailed }, body)
    }
}
