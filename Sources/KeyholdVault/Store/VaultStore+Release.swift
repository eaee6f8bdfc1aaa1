import KeyholdCore

/// The row a release is decided on, read with its sealed key and secret: its secret can then be
/// opened off the store lock (`SecretOpener`, by the session that asked), and the writer, inside
/// the release's own transaction, only confirms that the item's row is still byte for byte this
/// one (`openConfirmed`). The group commit's leader, which every member of its group waits for,
/// then no longer decodes and opens each member's row: that was about a third of its work per
/// `get` (measured with perf under 64 clients).
///
/// A class: it passes from the lookup through the gate to the group commit's leader, and a
/// struct of this many references was copied (each one retained and released) at every step
/// (about 2% of the broker's CPU at 64 clients, perf).
public final class ReleaseRow: Sendable {
    /// What the row decoded to, with every check of `VaultStore.item(owner:service:account:)`.
    public let item: StoredItem
    let row: VaultStore.ItemRow
    let wrappedKey: [UInt8]
    let sealedSecret: [UInt8]
    /// The writer's `itemRowsVersion` as read before this row's lookup began, when it was even
    /// (no change of the writer's uncommitted): while the version still has that value, nothing
    /// has changed a row of `items` since, so the row is what the file holds (`storedRowIs`).
    let readUnder: (version: RowsVersion, value: UInt64)?

    /// The bytes of its sealed boxes (the wrapped key and the sealed secret), for a bound on
    /// how many rows are kept in memory.
    public var sealedByteCount: Int { wrappedKey.count + sealedSecret.count }

    init(item: StoredItem, row: VaultStore.ItemRow, wrappedKey: [UInt8], sealedSecret: [UInt8],
         readUnder: (version: RowsVersion, value: UInt64)?) {
        self.item = item
        self.row = row
        self.wrappedKey = wrappedKey
        self.sealedSecret = sealedSecret
        self.readUnder = readUnder
    }
}

/// Opens a `ReleaseRow`'s secret with the vault key and nothing else: no database access, so
/// the broker's sessions use it without a lock. Only `VaultStore.openConfirmed` decides whether
/// what it opened is released.
public struct SecretOpener: Sendable {
    let wrappingKey: WrappingKey

    /// The secret of `row` (errors as `VaultStore.openCurrentSecret`'s for the same row).
    public func open(_ row: ReleaseRow, appPassword: AppPasswordKey?) throws(StoreError) -> SecureBytes {
        try VaultStore.openSealed(row.item, wrappedKey: row.wrappedKey, sealedSecret: row.sealedSecret,
                                  wrappingKey: wrappingKey, appPassword: appPassword)
    }
}

extension VaultStore {
    public var secretOpener: SecretOpener { SecretOpener(wrappingKey: wrappingKey) }

    /// `item(owner:service:account:)` with the sealed row it came from. A row that does not
    /// open, or whose names or owner differ from the request, is `.integrity`: never another item.
    public func releaseRow(owner: UInt32, service: String, account: String) throws(StoreError) -> ReleaseRow? {
        guard service.utf8.count <= Limits.maxTextBytes, account.utf8.count <= Limits.maxTextBytes else { throw .tooLarge }
        // Read before the first statement, so before a reader's snapshot begins.
        let readUnder = itemRowsVersion.flatMap { version in
            let value = version.current
            return value & 1 == 0 ? (version, value) : nil
        }
        let lookup = BlindIndex(key: blindIndexKey, owner: owner, service: service, account: account)
        guard let (row, wrappedKey, sealedSecret) = try sealedRow(lookup: lookup.bytes) else { return nil }
        let item = try decode(row, generations: try verifiedGenerations())
        guard item.owner == owner, item.service == service, item.account == account else { throw .integrity }
        return ReleaseRow(item: item, row: row, wrappedKey: wrappedKey, sealedSecret: sealedSecret, readUnder: readUnder)
    }

    /// What a release gives out, read under the writer's transaction: `opened` (the secret of
    /// `row`, from `SecretOpener`) when the item's stored row is still byte for byte `row` and
    /// its generation is the one the verified generation record holds now (the only input of
    /// `openCurrentSecret`'s checks that a byte-identical row does not fix); otherwise, or with
    /// nothing opened, `openCurrentSecret(row.item)` with all its checks and errors. Whatever
    /// is not returned is wiped.
    public func openConfirmed(_ row: ReleaseRow, opened: SecureBytes?, appPassword: AppPasswordKey?) throws(StoreError)
        -> (secret: SecureBytes, current: StoredItem) {
        if let opened {
            let unchanged: Bool
            do throws(StoreError) {
                unchanged = try storedRowIs(row)
            } catch {
                opened.wipe()
                throw error
            }
            if unchanged { return (opened, row.item) }
            opened.wipe()
        }
        return try openCurrentSecret(row.item, appPassword: appPassword)
    }

    private func storedRowIs(_ expected: ReleaseRow) throws(StoreError) -> Bool {
        if !isUnchangedSinceRead(expected) {
            let same: Bool
            do {
                // `sealedRow(id:)`'s query, compared in place: no copy of a row that is the same.
                same = try db.withStatement(Self.sealedRowByID) { (s) throws(DatabaseError) in
                    try s.bind(1, blob: expected.item.id.bytes)
                    return try s.step() && expected.row.isStored(in: s)
                        && s.blobIs(Self.columnAfterItem, expected.wrappedKey) && s.blobIs(Self.columnAfterItem + 1, expected.sealedSecret)
                }
            } catch { throw StoreError.from(error) }
            guard same else { return false }
        }
        try checkGeneration(expected.item.id, expected.row.generation, in: try verifiedGenerations())
        return true
    }

    /// Whether no row of `items` can have changed since `row` was read: inside a write
    /// transaction (whose start took account of other connections' commits, and whose write lock
    /// keeps them out), this store's version is still the even value read before the row's
    /// lookup. Any change of this transaction's own has made it odd, so never equal.
    private func isUnchangedSinceRead(_ row: ReleaseRow) -> Bool {
        guard let stamp = row.readUnder, let version = itemRowsVersion, stamp.version === version,
              db.writeSnapshot != nil else { return false }
        return version.current == stamp.value
    }
}
