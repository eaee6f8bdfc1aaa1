import Glibc
import KeyholdCore

/// A read-only second connection to the broker's vault file, for the reads a caller can make
/// long (`LongReads`: list, search, audit pages, audit verify). The broker's store lock is held
/// across each group commit and its fsync; in WAL mode this connection reads the last committed
/// state meanwhile, so a long read never holds the store that releases wait for. It opens no
/// secret: `LongReads` has no read that does. Not thread-safe: the broker keeps it behind its
/// own lock.
public final class VaultReader {
    private let store: VaultStore

    private init(store: VaultStore) { self.store = store }

    /// Opens `writer`'s database read-only. `.integrity` when a path names another file than
    /// the one the writer has open (the database, its WAL or its shared memory; other device or
    /// inode, before the open or after its first read): a reader must never answer from a file
    /// put in the vault's place. The first read is part of the open because SQLite opens the WAL
    /// by path only then; the reader keeps what it opened, whatever the paths name later.
    public static func open(for writer: VaultStore) throws(StoreError) -> sending VaultReader {
        let seed = writer.readerSeed
        // The writer could not name its files at open: nothing to compare a reader's with.
        guard !seed.fileIdentities.isEmpty else { throw .io(code: ENODATA) }
        let path = seed.stateDirectory + "/" + StateDirectory.databaseFileName
        let db = try StateDirectory.openReader(path, expecting: seed.fileIdentities)
        return VaultReader(store: VaultStore(reader: seed, db: db))
    }

    /// One page of `VaultStore.items(owner:after:limit:)`, in one read transaction.
    public func items(owner: UInt32, after cursor: VaultStore.ItemPageCursor?, limit: Int) throws(StoreError)
        -> VaultStore.ItemPage {
        try snapshot { () throws(StoreError) in try store.items(owner: owner, after: cursor, limit: limit) }
    }

    /// One page of `VaultStore.search(owner:attributes:after:limit:)`, in one read transaction.
    public func search(owner: UInt32, attributes: [String: String], after cursor: VaultStore.ItemPageCursor?, limit: Int) throws(StoreError)
        -> VaultStore.ItemPage {
        try snapshot { () throws(StoreError) in try store.search(owner: owner, attributes: attributes, after: cursor, limit: limit) }
    }

    /// One page of `VaultStore.auditEntries`, in one read transaction.
    public func auditEntries(visibleTo uid: UInt32?, since: Int64?, item: (service: String, account: String)?,
                             afterSeq: Int64?, ownAfter: Int64?, limit: Int?) throws(StoreError) -> [AuditEntryView] {
        try snapshot { () throws(StoreError) in
            try store.auditEntries(visibleTo: uid, since: since, item: item, afterSeq: afterSeq, ownAfter: ownAfter, limit: limit)
        }
    }

    /// `VaultStore.auditSeq(uid:own:)`, in one read transaction.
    public func auditSeq(uid: UInt32, own: Int64) throws(StoreError) -> Int64 {
        try snapshot { () throws(StoreError) in try store.auditSeq(uid: uid, own: own) }
    }

    /// `VaultStore.verifyAudit(visibleTo:)` on one snapshot: entries committed meanwhile are
    /// not part of it (the fast path then sees rows beyond the snapshot's head and leaves the
    /// verdict to the sequential pass, which reads the snapshot).
    public func verifyAudit(visibleTo uid: UInt32?) throws(StoreError) -> AuditVerifyAnswer {
        try snapshot { () throws(StoreError) in try store.verifyAudit(visibleTo: uid) }
    }

    private func snapshot<R>(_ body: () throws(StoreError) -> R) throws(StoreError) -> R {
        try store.db.readTransaction(mapError: StoreError.from, body)
    }

    /// Later lookups fail with `.closed`. The broker closes its readers before the writer, so the
    /// writer's close is the last one and checkpoints and removes the WAL.
    public func close() { store.close() }
}

/// The reads a caller can make long (a listing, a search, the audit log and its check): the
/// broker runs them on a reader of their own, or on the writer when it has no reader.
public protocol LongReads {
    func items(owner: UInt32, after cursor: VaultStore.ItemPageCursor?, limit: Int) throws(StoreError)
        -> VaultStore.ItemPage
    func search(owner: UInt32, attributes: [String: String], after cursor: VaultStore.ItemPageCursor?, limit: Int) throws(StoreError)
        -> VaultStore.ItemPage
    func auditEntries(visibleTo uid: UInt32?, since: Int64?, item: (service: String, account: String)?,
                      afterSeq: Int64?, ownAfter: Int64?, limit: Int?) throws(StoreError) -> [AuditEntryView]
    func auditSeq(uid: UInt32, own: Int64) throws(StoreError) -> Int64
    func verifyAudit(visibleTo uid: UInt32?) throws(StoreError) -> AuditVerifyAnswer
}

extension VaultReader: LongReads {}
extension VaultStore: LongReads {}
