import KeyholdCore

/// Group commit support: the broker runs several callers' store calls inside one outer
/// transaction, each call as a nested transaction, and commits them with one fsync.
extension VaultStore {
    /// Runs `body` inside one outer transaction and commits it. Every store call `body` makes
    /// is a nested transaction that undoes only itself when it fails. Returns false when the
    /// COMMIT failed: then nothing `body` wrote is stored, and the caller must release nothing.
    public func groupTransaction(_ body: () -> Void) -> Bool {
        headDeferral = .unchecked
        defer { headDeferral = .off }
        return db.groupTransaction { () -> Bool in
            body()
            // The head the group's plain entries left to its end; if it cannot be written,
            // nothing of the group is committed.
            do throws(DatabaseError) { try flushDeferredHead() } catch { return false }
            return true
        }
    }

    /// One member of a group: its writes land together or not at all. Outside a group this
    /// is an ordinary transaction committed on return.
    public func memberTransaction<R>(_ body: () throws(StoreError) -> R) throws(StoreError) -> R {
        try db.transaction(mapError: { _ in StoreError.auditWriteFailed }, body)
    }
}

/// The audit head inside a group commit. Moving the head row (and re-tagging the generation
/// record with it) for every member cost the leader, which every member waits for, about a
/// fifth of its work per `get` (measured under 64 clients); a group's plain entries (those that
/// carry no item change) therefore leave it to the group's end, one write per commit. Until
/// then the chain continues from the newest entry: at the group's first entry that is checked
/// to be the head's own (else the group moves the head per entry, as outside a group), so any
/// newer entry is one of this group's; a member that fails takes its entries back with its
/// savepoint. The head and the generation record stay a consistent pair meanwhile (the record's
/// tag names the stored head), and whoever reads the head for anything else (`readHead`) has it
/// written first.
enum HeadDeferral {
    /// Outside a group commit, or a group whose newest entry was not the head's at its start.
    case off
    /// A group commit before its first entry.
    case unchecked
    /// The head row is written at the group's end (and when something else reads it).
    case on
}

extension VaultStore {
    /// Whether this entry leaves the head to the group's end; decides it at the group's first.
    func defersHead() throws(DatabaseError) -> Bool {
        switch headDeferral {
        case .off: return false
        case .on: return true
        case .unchecked:
            let head = try storedHead(), newest = try newestEntry()
            let consistent = head.map { h in newest.map { $0.seq == h.seq && KeyedHash.equal($0.mac, h.mac) } ?? false } ?? false
            headDeferral = consistent ? .on : .off
            return consistent
        }
    }

    /// The newest stored entry's seq and MAC (the chain's end inside a deferring group). Within
    /// one write transaction the entry this connection appended last is the newest as long as
    /// nothing was undone since (`Database.writeSnapshot`; the only other statement that changes
    /// `audit`, a prune's DELETE, forgets it first), so a group's later members do not read it.
    func newestEntry() throws(DatabaseError) -> (seq: Int64, mac: [UInt8])? {
        if let kept = newestWritten, let now = db.writeSnapshot, kept.snapshot == now { return (kept.seq, kept.mac) }
        return try db.withStatement("SELECT seq, mac FROM audit ORDER BY seq DESC LIMIT 1") { (s) throws(DatabaseError) in
            try s.step() ? (s.int64(0), s.blob(1)) : nil
        }
    }

    /// Writes the head the group's plain entries deferred, if they moved it. The deferral goes
    /// on: what is deferred is always read from the entries themselves, so a member that fails
    /// after this (its savepoint taking this write back) leaves nothing stale behind.
    func flushDeferredHead() throws(DatabaseError) {
        guard headDeferral == .on, let newest = try newestEntry(), let head = try storedHead(), newest.seq > head.seq else { return }
        try writeHead(seq: newest.seq, mac: newest.mac)
    }
}
