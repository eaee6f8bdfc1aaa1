import Glibc
import Synchronization
import KeyholdVault

/// The broker's read-only connections (`VaultReader`), each behind its own lock, for the lookup
/// a release is decided on: it then need not wait for the store lock, which a group commit holds
/// across its fsync. Two at most (the broker's machine class has two cores); empty when none
/// could be opened, and the writer answers lookups as before.
final class ReaderPool: Sendable {
    private let readers: [BlockingMutex<VaultReader>]
    private let next = Atomic<UInt>(0)

    /// No reader: the writer answers every lookup.
    init() { readers = [] }

    private init(_ readers: [BlockingMutex<VaultReader>]) { self.readers = readers }

    /// `count` readers of `writer`'s file; throws (closing any it opened) when one is refused.
    static func open(count: Int, of writer: VaultStore) throws(StoreError) -> ReaderPool {
        var opened: [BlockingMutex<VaultReader>] = []
        for _ in 0..<count {
            do throws(StoreError) {
                opened.append(BlockingMutex(try VaultReader.open(for: writer)))
            } catch {
                for reader in opened { reader.withLock { $0.close() } }
                throw error
            }
        }
        return ReaderPool(opened)
    }

    var isEmpty: Bool { readers.isEmpty }

    /// `body` on a free reader, else on the next one in turn once it is free; nil when there is none.
    func withReader<R>(_ body: (VaultReader) -> R) -> R? {
        guard !readers.isEmpty else { return nil }
        for reader in readers {
            if let r = reader.withLockIfFree(body) { return r }
        }
        let i = next.wrappingAdd(1, ordering: .relaxed).oldValue % UInt(readers.count)
        return readers[Int(i)].withLock(body)
    }

    /// Waits for each reader's lookup in flight; later lookups fail with `.closed`.
    func close() {
        for reader in readers { reader.withLock { $0.close() } }
    }
}
