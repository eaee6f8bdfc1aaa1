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
final class TPMRollbackCounter: Sendable {
    let tcti: String
    let index: UInt32
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

    init(tcti: String, vaultTag: UInt16) {
        self.tcti = tcti
        index = TPMDevice.counterIndex(vaultTag: vaultTag)
    }

    enum Verdict: Equatable {
        case fresh                                  // no counter yet: this start makes one
        case current(UInt64)
        case rolledBack(recorded: UInt64?, tpm: UInt64)
    }

    func check(_ store: VaultStore) throws(StoreError) -> Verdict {
        let recorded = try store.recordedRollbackCounter()
        let tpm: UInt64?
        do throws(TPMError) { tpm = try TPMDevice(tcti: tcti).readCounter(index: index) } catch {
            throw .keyProtector(TPMKeyProtector.failure(error))
        }
        guard let tpm else { return .fresh }
        guard let recorded, recorded >= tpm else { return .rolledBack(recorded: recorded, tpm: tpm) }
        return .current(tpm)
    }

    /// Records the TPM's counter in the vault as it is now (first start, accepted rollback).
    func adopt(_ store: VaultStore) throws(StoreError) {
        let value: UInt64
        do throws(TPMError) {
            let device = try TPMDevice(tcti: tcti)
            if let v = try device.readCounter(index: index) { value = v } else { value = try device.incrementCounter(index: index) }
        } catch {
            throw .keyProtector(TPMKeyProtector.failure(error))
        }
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
        let tpm: UInt64?
        do throws(TPMError) { tpm = try TPMDevice(tcti: tcti).readCounter(index: index) } catch {
            return .tpmGone(error.description)
        }
        guard let tpm, tpm == recorded else {
            return .rolledBack("it records TPM counter \(recorded), the TPM is at \(tpm.map(String.init) ?? "no counter")")
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
            let device = try TPMDevice(tcti: tcti)
            guard let current = try device.readCounter(index: index) else { throw TPMError.unexpectedResponse }
            if let k = known.withLock({ $0 }), k.value != current {
                return .rolledBack("this broker last wrote TPM counter \(k.value), the TPM is at \(current)")
            }
            // The vault first: if it cannot record the value, the TPM is not moved ahead of it.
            do throws(StoreError) { try store.recordRollbackCounter(current + 1) } catch {
                BrokerMain.fail("the vault could not record the TPM rollback counter (\(error)); stopping before answering",
                                code: Int32(Outcome.brokerUnavailable.rawValue))
            }
            let now = try device.incrementCounter(index: index)
            if now != current + 1 { try? store.recordRollbackCounter(now) }
            known.withLock { $0 = (now, MonotonicClock.nanoseconds()) }
            return .current
        } catch {
            BrokerMain.fail("the TPM rollback counter could not be advanced (\(error)); stopping before answering",
                            code: Int32(Outcome.brokerUnavailable.rawValue))
        }
    }
}

/// The start-up decision on the TPM counter, as for the anchor file.
enum TPMRollbackStart {
    /// The accepted rollback's audit entry, if there was one (for its system-log copy).
    static func check(_ counter: TPMRollbackCounter, _ store: VaultStore, _ options: BrokerOptions, executable: String) -> AuditRecord? {
        let verdict: TPMRollbackCounter.Verdict
        do throws(StoreError) { verdict = try counter.check(store) } catch {
            BrokerMain.fail("cannot check the TPM rollback counter: \(error)", code: Int32(error.outcome.rawValue))
        }
        switch verdict {
        case .fresh, .current:
            do throws(StoreError) { try counter.adopt(store) } catch {
                BrokerMain.fail("cannot set up the TPM rollback counter: \(error)", code: Int32(error.outcome.rawValue))
            }
            return nil
        case .rolledBack(let recorded, let tpm):
            guard options.acceptRollback else {
                BrokerMain.fail("integrity failure: the vault was restored from an older copy (it records TPM counter \(recorded.map(String.init) ?? "none"), the TPM is at \(tpm)); nothing is served. If this copy is what you want, start once with --accept-rollback (the decision is audited)",
                                code: Int32(Outcome.integrityFailure.rawValue))
            }
            let record = AuditRecord(callerUID: geteuid(), callerPID: getpid(), executable: executable, operation: .acceptRollback,
                                     decision: .granted, reason: "tpm-counter recorded=\(recorded.map(String.init) ?? "none") tpm=\(tpm)", outcome: .ok)
            do throws(StoreError) {
                try store.append(record)
                try counter.adopt(store)
            } catch {
                BrokerMain.fail("cannot record the accepted rollback: \(error)", code: Int32(error.outcome.rawValue))
            }
            return record
        }
    }
}
