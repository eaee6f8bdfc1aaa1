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
    }

    /// After every store call: if a change that matters was committed since the last look,
    /// advance. A TPM that cannot be advanced stops the broker before it answers (fail closed:
    /// the caller sees *broker unavailable*; the next start checks the counter again).
    func advance(_ store: VaultStore) {
        let from = scanned.withLock { $0 }
        guard let head = try? store.authenticatedHeadSequence(), head > from else { return }
        scanned.withLock { $0 = head }
        guard (try? store.rollbackRelevantChange(after: from)) == true else { return }
        do throws(TPMError) {
            let device = try TPMDevice(tcti: tcti)
            guard let current = try device.readCounter(index: index) else { throw TPMError.unexpectedResponse }
            // The vault first: if it cannot record the value, the TPM is not moved ahead of it.
            do throws(StoreError) { try store.recordRollbackCounter(current + 1) } catch {
                BrokerMain.fail("the vault could not record the TPM rollback counter (\(error)); stopping before answering",
                                code: Int32(Outcome.brokerUnavailable.rawValue))
            }
            let now = try device.incrementCounter(index: index)
            if now != current + 1 { try? store.recordRollbackCounter(now) }
        } catch {
            BrokerMain.fail("the TPM rollback counter could not be advanced (\(error)); stopping before answering",
                            code: Int32(Outcome.brokerUnavailable.rawValue))
        }
    }
}

/// The start-up decision on the TPM counter, as for the anchor file.
enum TPMRollbackStart {
    static func check(_ counter: TPMRollbackCounter, _ store: VaultStore, _ options: BrokerOptions, executable: String) {
        let verdict: TPMRollbackCounter.Verdict
        do throws(StoreError) { verdict = try counter.check(store) } catch {
            BrokerMain.fail("cannot check the TPM rollback counter: \(error)", code: Int32(error.outcome.rawValue))
        }
        switch verdict {
        case .fresh, .current:
            do throws(StoreError) { try counter.adopt(store) } catch {
                BrokerMain.fail("cannot set up the TPM rollback counter: \(error)", code: Int32(error.outcome.rawValue))
            }
            return
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
        }
    }
}
