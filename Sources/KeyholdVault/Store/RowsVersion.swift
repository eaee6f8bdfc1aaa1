import CSQLite

/// The version of one table's rows as the connection that watches them changes them
/// (`Database.watchRows`); read from any thread. Outlives the connection's hook: the connection
/// keeps it, and SQLite drops the hook when the connection closes.
public final class RowsVersion: @unchecked Sendable {
    let watch: UnsafeMutablePointer<csqlite_row_watch>

    init(table: String) {
        watch = .allocate(capacity: 1)
        watch.initialize(to: csqlite_row_watch())
        withUnsafeMutableBytes(of: &watch.pointee.table) { buffer in
            let name = Array(table.utf8.prefix(buffer.count - 1))
            buffer.copyBytes(from: name)
        }
    }

    deinit { watch.deallocate() }

    /// Even: no change to the rows is uncommitted. Any committed change since an earlier reading
    /// makes it differ from that reading.
    public var current: UInt64 { csqlite_rows_version(watch) }
}
