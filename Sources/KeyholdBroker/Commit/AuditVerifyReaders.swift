import KeyholdCore
import KeyholdVault

/// Where `audit verify` reads the chain (about 1 s at a million entries): on a read-only
/// connection opened for that verify, with the checks every reader is opened under
/// (`VaultReader.open`), and closed after. So one user verifying in a loop holds up neither
/// releases nor other users' lists, searches and audit pages, which share the long-read reader.
///
/// Bounded, since the broker is root and each verify's fast path uses every core: one verify in
/// flight per uid, and two at a time for all non-root uids (the cores of the machines this is
/// measured on); root has one of its own, so users cannot keep the administrator from checking
/// the log. Beyond either bound the answer is *busy* at once, not a wait: no broker thread is
/// parked behind a verify, and the client library already asks again for 3 s.
final class AuditVerifyReaders: Sendable {
    static let sharedCount = 2
    static let perUIDBusy = Denial(.busy, "another audit verify of this user is in flight; try again when it ends")
    static let sharedBusy = Denial(.busy, "too many audit verifies in flight; try again shortly")

    private let seed: VaultStore.ReaderSeed
    private let inFlight = InFlightUIDs()
    /// Held while a verify's reader is open: `sharedCount` for non-root uids, then root's. A
    /// slot's state is `closed` once the vault closed: no reader opens after the writer closed
    /// (its close must be the last one, which checkpoints and removes the WAL).
    private let slots: [BlockingMutex<SlotState>]

    final class SlotState { var closed = false }

    init(_ seed: VaultStore.ReaderSeed) {
        self.seed = seed
        slots = (0...Self.sharedCount).map { _ in BlockingMutex(SlotState()) }
    }

    /// `body` on a reader opened for it, for `uid`; `refusal` is checked once the reader is open
    /// (a rollback seen meanwhile: RollbackWatch.swift). `fallback` runs outside any slot (it
    /// may need the store lock, under which `close` waits for the slots), while this uid's
    /// verify is still counted in flight.
    func read<R>(uid: UInt32, refusal: () -> Denial?, _ body: (VaultReader) -> Result<R, Denial>,
                 fallback: (StoreError) -> Result<R, Denial>) -> Result<R, Denial> {
        guard inFlight.reserve(uid) else { return .failure(Self.perUIDBusy) }
        defer { inFlight.release(uid) }
        let mine = uid == 0 ? slots[Self.sharedCount...] : slots[..<Self.sharedCount]
        for slot in mine {
            let attempt: Result<Result<R, Denial>, StoreError>? = slot.withLockIfFree { state in
                guard !state.closed else { return .success(.failure(Denial(StoreError.closed.outcome))) }
                let reader: VaultReader
                do throws(StoreError) { reader = try VaultReader.open(seed) } catch { return .failure(error) }
                defer { reader.close() }
                if let refused = refusal() { return .success(.failure(refused)) }
                return .success(body(reader))
            }
            switch attempt {
            case nil: continue
            case .success(let result): return result
            case .failure(let unopened): return fallback(unopened)
            }
        }
        return .failure(Self.sharedBusy)
    }

    /// Waits for the verifies whose reader is open; no reader opens after.
    func close() {
        for slot in slots { slot.withLock { $0.closed = true } }
    }
}
