import Glibc
import Synchronization
import KeyholdCore
import KeyholdVault
import KeyholdTPM

/// Rollback detection with the TPM key protector (issue 13 item 2): a TPM NV counter per
/// vault, whose value the vault records bound to its audit head. A change that matters for
/// rollback advances both before the broker answers the request; a vault whose recorded value
/// is behind the TPM's was restored from an older copy, whatever else was restored with it.
///
/// Order of an advance: record C+1 in the vault (committed), then increment the TPM to C+1.
/// A crash between leaves the vault ahead (never a false alarm); the counter is never ahead of
/// a vault that saw every change.
///
/// Only this vault key moves the counter (issue 36 item 3): it answers only to an auth value
/// derived from the key (`VaultStore.rollbackCounterAuth`, TPMCounter.swift), and one removed
/// or replaced by someone else is a refusal here and at start (KeyProtectorStart.swift).
final class TPMRollbackCounter: Sendable {
    let access: TPMAccess
    let index: UInt32
    /// The counter's authorization value (from the vault key: `VaultStore.rollbackCounterAuth`).
    private let auth: SecureBytes
    /// The audit sequence number up to which changes were looked at (under the store lock).
    private let scanned = Mutex<Int64>(0)
    /// The TPM's value as this broker last wrote or read it, and when it last read or wrote
    /// it (monotonic ns). While the broker runs it is the only writer of its counter, so this
    /// value is the TPM's unless someone else moved it (RollbackWatch.swift says when the TPM
    /// is asked again). nil until the start-up check adopted the counter.
    private let known = Mutex<(value: UInt64, confirmedAt: UInt64)?>(nil)

    /// How stale the cached TPM value may get before a request makes the broker read the TPM
    /// again. One NV read a second at most (a real TPM answers one in a few ms), instead of
    /// one per store access; see SECURITY.md "Rollback" for what the interval leaves open.
    static let recheckNanoseconds: UInt64 = 1_000_000_000

    init(access: TPMAccess, index: UInt32, auth: SecureBytes) {
        self.access = access
        self.index = index
        self.auth = auth
    }

    /// What is at the counter's index now.
    func state() throws(TPMError) -> TPMDevice.CounterState {
        let device = try access.open()
        return try auth.withUnsafeBytes { (a) throws(TPMError) in try device.counterState(index: index, auth: a) }
    }

    /// Makes the vault's counter (after removing what is at its index, when `replacing`) and
    /// returns its first value. Removing takes the owner hierarchy's authorization.
    func define(replacing: Bool) throws(TPMError) -> UInt64 {
        let device = try access.open()
        if replacing { try device.undefineCounter(index: index) }
        return try auth.withUnsafeBytes { (a) throws(TPMError) in try device.defineCounter(index: index, auth: a) }
    }

    /// Records the TPM's counter value in the vault (every start; after an accepted rollback).
    func adopt(_ store: VaultStore, value: UInt64) throws(StoreError) {
        try store.recordRollbackCounter(value)
        scanned.withLock { $0 = (try? store.authenticatedHeadSequence()) ?? 0 }
        known.withLock { $0 = (value, MonotonicClock.nanoseconds()) }
    }

    /// What a request's check found (RollbackWatch.swift).
    enum Watch: Equatable {
        case current
        /// The vault is behind the TPM, or the TPM is not where this broker left it.
        case rolledBack(String)
        /// The TPM does not answer: the broker stops (fail closed).
        case tpmGone(String)
    }

    /// Before every store access: the vault's record against the value this broker last wrote
    /// (a read of one row and a MAC, no TPM command); the TPM itself only when the record is
    /// not that value or the cached value is older than `recheckNanoseconds`.
    func watch(_ store: VaultStore) -> Watch {
        guard let k = known.withLock({ $0 }) else { return .current }
        let recorded: UInt64?
        do throws(StoreError) { recorded = try store.recordedRollbackCounter() } catch {
            // Only a record that does not verify is a verdict; an I/O error fails the request itself.
            guard error == .integrity else { return .current }
            return .rolledBack("its rollback counter record is altered or names an audit entry it does not have")
        }
        guard let recorded, recorded >= k.value else {
            return .rolledBack("it records TPM counter \(recorded.map(String.init) ?? "none"), this broker last wrote \(k.value)")
        }
        let now = MonotonicClock.nanoseconds()
        guard recorded != k.value || now &- k.confirmedAt >= Self.recheckNanoseconds else { return .current }
        let found: TPMDevice.CounterState
        do throws(TPMError) { found = try state() } catch { return .tpmGone(error.description) }
        guard case .ours(let tpm?) = found, tpm == recorded else {
            return .rolledBack("it records TPM counter \(recorded), the TPM has \(Self.describe(found))")
        }
        known.withLock { $0 = (tpm, now) }
        return .current
    }

    /// After every store call: if a change that matters was committed since the last look,
    /// advance. A TPM that cannot be advanced stops the broker before it answers (fail closed:
    /// the caller sees *broker unavailable*; the next start checks the counter again).
    /// Returns `.rolledBack` instead of advancing when the TPM is not at the value this broker
    /// last wrote (someone else moved it: a second copy of this vault served on this machine).
    func advance(_ store: VaultStore) -> Watch {
        let from = scanned.withLock { $0 }
        let head: Int64
        do throws(StoreError) { head = try store.authenticatedHeadSequence() } catch {
            BrokerMain.fail("the vault's audit head could not be read to advance the TPM rollback counter (\(error)); stopping before answering",
                            code: Int32(Outcome.brokerUnavailable.rawValue))
        }
        guard head > from else { return .current }
        scanned.withLock { $0 = head }
        // Not knowing what changed stops the broker, as a counter that cannot move does:
        // skipping could leave a change out of the counter, and counting on every error would
        // write the TPM's NV on every request while the fault lasts.
        let relevant: Bool
        do throws(StoreError) { relevant = try store.rollbackRelevantChange(after: from) } catch {
            BrokerMain.fail("the vault could not tell whether its last changes need the TPM rollback counter (\(error)); stopping before answering",
                            code: Int32(Outcome.brokerUnavailable.rawValue))
        }
        guard relevant else { return .current }
        do throws(TPMError) {
            let device = try access.open()
            let found = try auth.withUnsafeBytes { (a) throws(TPMError) in try device.counterState(index: index, auth: a) }
            let last = known.withLock { $0 }
            guard case .ours(let current?) = found, let last, last.value == current else {
                return .rolledBack("this broker last wrote TPM counter \(last.map { String($0.value) } ?? "none"), the TPM has \(Self.describe(found))")
            }
            // The vault first: if it cannot record the value, the TPM is not moved ahead of it.
            do throws(StoreError) { try store.recordRollbackCounter(current + 1) } catch {
                BrokerMain.fail("the vault could not record the TPM rollback counter (\(error)); stopping before answering",
                                code: Int32(Outcome.brokerUnavailable.rawValue))
            }
            let now = try auth.withUnsafeBytes { (a) throws(TPMError) in try device.incrementCounter(index: index, auth: a) }
            if now != current + 1 { try? store.recordRollbackCounter(now) }
            known.withLock { $0 = (now, MonotonicClock.nanoseconds()) }
            return .current
        } catch {
            BrokerMain.fail("the TPM rollback counter could not be advanced (\(error)); stopping before answering",
                            code: Int32(Outcome.brokerUnavailable.rawValue))
        }
    }
}

extension TPMRollbackCounter {
    /// What the TPM has at the index, in a refusal's words.
    static func describe(_ state: TPMDevice.CounterState) -> String {
        switch state {
        case .absent: "no counter (it was removed)"
        case .ours(let v): "value \(v.map(String.init) ?? "unset")"
        case .foreign: "a counter this vault key did not make (the vault's was removed and replaced)"
        }
    }
}
