import Glibc
import Synchronization
import KeyholdCore
import KeyholdProtocol
import KeyholdVault

/// Rollback detection on every request (issue 13 item 2), not only at start: before each store
/// access (`Broker.withStore`; a group commit is one access for the whole group) the vault's
/// recorded counter and head are compared with what this broker last wrote to the TPM and the
/// anchor file. On a mismatch the broker closes the vault and answers every request, the one
/// in flight included, with *integrity* and the message below, until an administrator restarts
/// it (the start-up check then refuses until `--accept-rollback`).
///
/// Why a cache and not a TPM read per access: while the broker runs it is the only legitimate
/// writer of its counter and its anchor, so "what I last wrote" is the TPM's value unless
/// someone else wrote it. Comparing the vault with that costs one row read and a MAC. The TPM
/// is read again only when the vault's record differs from the cache, when the broker is about
/// to increment it anyway (`TPMRollbackCounter.advance`), and when the cached value is older
/// than `TPMRollbackCounter.recheckNanoseconds` (1 s): that re-read is what notices a counter
/// moved behind the broker's back (a second copy of the vault served on this machine) and a
/// TPM that disappeared, at one NV read a second at most instead of one per request.
extension Broker {
    /// The message every request gets once a rollback was seen while serving.
    static func rollbackMessage(_ why: String) -> String {
        "integrity failure: the vault was restored from an older copy (\(why)); nothing is served until an administrator restarts the broker (then --accept-rollback, audited, if this copy is what they want)"
    }

    /// Called under the store lock before `body` runs. A verdict closes the store, so `body`
    /// and everything after it fail without releasing, writing or recording a counter.
    func watchRollbackGuards(_ store: VaultStore) {
        guard rollbackRefusal.withLock({ $0 == nil }) else { return }
        var problem: String?
        if let counter {
            switch counter.watch(store) {
            case .current: break
            case .rolledBack(let why): problem = why
            case .tpmGone(let why):
                // As when an increment fails: stop before answering (broker unavailable); the
                // key stays in no process, and the next start needs the TPM to unseal it.
                BrokerMain.fail("the TPM no longer answers (\(why)); stopping before answering", code: Int32(Outcome.brokerUnavailable.rawValue))
            }
        }
        if problem == nil, let anchor { problem = anchor.watch(store) }
        if let problem { refuseAfterRollback(problem, store) }
    }

    /// After every store call, still under the lock and before any member of a group commit
    /// is answered: the TPM counter and the anchor file follow the committed head.
    func advanceRollbackGuards(_ store: VaultStore) {
        guard rollbackRefusal.withLock({ $0 == nil }) else { return }
        if let counter, case .rolledBack(let why) = counter.advance(store) {
            refuseAfterRollback(why, store)
            return
        }
        anchor?.advance(store)
    }

    private func refuseAfterRollback(_ why: String, _ store: VaultStore) {
        let message = Self.rollbackMessage(why)
        rollbackRefusal.withLock { $0 = message }
        closeVault(store)
        log(message)
        syslog.send("rollback-detected \(why)")
    }

    /// Session's hook: once a rollback was seen, the answer to every request (replacing the
    /// *audit unavailable* or other error a closed store caused). An `.ok` answer is kept: it
    /// was served before the verdict.
    func rollbackAnswer(replacing response: Response? = nil) -> Response? {
        guard let message = rollbackRefusal.withLock({ $0 }) else { return response }
        if let response, response.outcome == .ok { return response }
        response?.secret?.wipe()
        return Response(.integrityFailure, detail: message)
    }
}
