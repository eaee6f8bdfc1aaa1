import Synchronization
import KeyholdCore
import KeyholdVault
import KeyholdProtocol

/// Rows the event loop's workers looked up for a `get` (Session.forWorker), kept while the
/// writer has committed no change to any row of `items` since they were read
/// (`VaultStore.itemRowsVersion`): a kept row is then what a reader would read again, and the
/// lookup costs a dictionary probe instead of a read transaction (which, after every commit of
/// another connection, SQLite starts with an empty page cache). Measured with the benchmark
/// (docs/BENCHMARKS.md). The thread path (first requests, gated items, `rotate`) reads afresh.
///
/// A kept row is only what the release gate decides on, as a reader's is: before anything is
/// released the writer confirms under its lock that the stored row is still byte for byte this
/// one and its generation current (`VaultStore.openConfirmed`), so a row changed on disk by
/// anyone but the writer is caught there, as it was before. Only rows found are kept (not
/// "not found", not errors); everything is dropped when the version moves or a bound is reached.
/// The rows hold sealed boxes as stored and the decoded names, never an opened secret.
final class ReleaseRowCache: Sendable {
    private struct Key: Hashable {
        let owner: UInt32
        let service: String
        let account: String
    }

    private struct Kept {
        var version: UInt64 = 0
        var rows: [Key: ReleaseRow] = [:]
        var bytes = 0
    }

    /// Bounds on what is kept (each row counts its boxes and a fixed share for the rest).
    static let maxRows = 1024
    static let maxBytes = 8 << 20
    private static let rowOverhead = 512

    private let version: RowsVersion?
    private let kept = Mutex(Kept())

    /// `version`: the writer's (nil: nothing is kept).
    init(version: RowsVersion?) { self.version = version }

    /// Rows kept now (for tests).
    var count: Int { kept.withLock { $0.rows.count } }

    /// `owner`'s row for `ref`: the kept one when the version has not moved since it was read,
    /// else `read()`'s, kept when it found a row.
    func row(owner: UInt32, _ ref: ItemReference, read: () -> Result<ReleaseRow?, Denial>) -> Result<ReleaseRow?, Denial> {
        guard let version else { return read() }
        let key = Key(owner: owner, service: ref.service, account: ref.account)
        // Read before the lookup's snapshot: a change committed after it moves the version, so
        // what this lookup reads is never kept as newer than it is.
        let now = version.current
        if now & 1 == 0, let row = kept.withLock({ $0.version == now ? $0.rows[key] : nil }) { return .success(row) }
        let result = read()
        guard now & 1 == 0, case .success(let row?) = result else { return result }
        let size = row.sealedByteCount + Self.rowOverhead
        kept.withLock { kept in
            if kept.version != now {
                // Rows of another version: an older one is dropped, a newer one wins.
                guard kept.version < now else { return }
                kept = Kept(version: now)
            }
            if kept.rows[key] == nil, kept.rows.count >= Self.maxRows || kept.bytes + size > Self.maxBytes {
                kept = Kept(version: now)
            }
            if let old = kept.rows.updateValue(row, forKey: key) {
                kept.bytes -= old.sealedByteCount + Self.rowOverhead
            }
            kept.bytes += size
        }
        return result
    }
}
