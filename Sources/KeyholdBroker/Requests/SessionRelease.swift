import Glibc
import KeyholdAuth
import KeyholdCore
import KeyholdVault
import KeyholdProtocol

/// The release path of a session (`get`, and `rotate`'s release): the item looked up under the
/// caller's uid on a reader, the release gate's decision, and the release committed with its
/// audit entry (`Broker.transact`, or `transactWithoutWaiting` for the event loop's workers)
/// before the secret is answered.
extension Session {
    /// What a release starts with (`get`, `rotate`): the item the request names, looked up
    /// under the caller's uid, and the gate's whole decision on it; or the (audited) refusal.
    enum Decision {
        case granted(ReleaseRow, Authorization)
        case answered(Response)
    }

    /// The lookup a release is decided on: a reader's (Broker.readReleaseRow), which does not
    /// wait for a commit's fsync; the writer's when there is no reader. What it finds is only
    /// what the gate decides on: `release` has the writer confirm the row under the store lock.
    func releaseLookup(_ ref: ItemReference) -> Result<ReleaseRow?, Denial> {
        broker.readReleaseRow(owner: caller.uid, ref) ?? broker.withStore { store in
            do throws(StoreError) {
                return .success(try store.releaseRow(owner: caller.uid, service: ref.service, account: ref.account))
            } catch {
                return .failure(Denial(error.outcome))
            }
        }
    }

    func decideRelease(_ request: Request) -> Decision {
        guard let ref = request.item else { return .answered(Response(.usage)) }
        let found: ReleaseRow
        switch releaseLookup(ref) {
        case .failure(let d): return .answered(deny(request, .get, item: nil, d))
        case .success(nil): return .answered(deny(request, .get, item: nil, Denial(.notFound)))
        case .success(let row?): found = row
        }
        return decideRelease(request, found: found)
    }

    /// The gate's decision on a row already looked up.
    func decideRelease(_ request: Request, found: ReleaseRow) -> Decision {
        let item = found.item
        if let d = refusedThroughAgent(item, request) { return .answered(deny(request, .get, item: item, d)) }
        switch authorize(item, request) {
        case .failure(let d): return .answered(deny(request, .get, item: item, d))
        case .success(let granted): return .granted(found, granted)
        }
    }

    typealias Opened = (secret: SecureBytes, current: StoredItem)

    /// Opens the secret and commits its release entry; nothing is returned before that entry is
    /// in. The one release path of `get` and `rotate`. `decided`: the row the gate decided on,
    /// for `get`: its secret is opened here, off the store lock, and the writer only confirms the
    /// row is unchanged (else opens the current row itself, as it does for a rotation's).
    func release(_ item: StoredItem, _ request: Request, method: AuthMethod, appPassword: AppPasswordKey?,
                 decided: ReleaseRow? = nil) -> Result<Opened, Denial> {
        let release = PendingRelease(self, item, request, method: method, appPassword: appPassword, decided: decided)
        return release.settle(broker.transact(release.record, writes: .oneAppendLast, release.work, discard: { $0.secret.wipe() }))
    }

    /// `release` of a `get` without waiting for the commit (the event loop's): `then` gets what
    /// `release` would return, on the thread that led the commit, and must not block.
    func releaseWithoutWaiting(_ item: StoredItem, _ request: Request, method: AuthMethod, appPassword: AppPasswordKey?,
                               decided: ReleaseRow, then: @escaping (Result<Opened, Denial>) -> Void) {
        let release = PendingRelease(self, item, request, method: method, appPassword: appPassword, decided: decided)
        broker.transactWithoutWaiting(release.record, writes: .oneAppendLast, release.work, discard: { $0.secret.wipe() }) {
            then(release.settle($0))
        }
    }

    /// A release's entry and the writer's part of it, built once for either way of committing.
    /// A class, as `ReleaseRow` is: the closures that carry it to the leader and back hold one
    /// reference instead of copying the entry's fields.
    private final class PendingRelease {
        let record: AuditRecord
        let preopened: SecureBytes?
        let work: (VaultStore) throws(StoreError) -> Opened

        init(_ session: Session, _ item: StoredItem, _ request: Request, method: AuthMethod, appPassword: AppPasswordKey?,
             decided: ReleaseRow?) {
            let record = session.event(request, .get, item: item, decision: .granted, method: method, outcome: .ok).record()
            // Any failure here is the writer's to report (it opens the row again and says why).
            let preopened = decided.flatMap { try? session.broker.secretOpener.open($0, appPassword: appPassword) }
            self.record = record
            self.preopened = preopened
            // The row is read again here and must still carry the access the gate judged on
            // `item` (else *conflict*): a policy tightened while the gate ran never releases the
            // new secret. Reads, then the one append (`Broker.MemberWrites.oneAppendLast`).
            work = { (store) throws(StoreError) -> Opened in
                let opened = if let decided { try store.openConfirmed(decided, opened: preopened, appPassword: appPassword) }
                    else { try store.openCurrentSecret(item, appPassword: appPassword) }
                do throws(StoreError) { try store.append(record) } catch { opened.secret.wipe(); throw error }
                return opened
            }
        }

        func settle(_ result: Result<Opened, StoreError>) -> Result<Opened, Denial> {
            switch result {
            case .success(let opened): return .success(opened)
            case .failure(let error):
                preopened?.wipe()  // not handed to the writer (the group failed first), or wiped there already
                if error == .appPasswordWrong { return .failure(Denial(.authenticationFailed, "wrong application password")) }
                return .failure(Denial(error.outcome))
            }
        }
    }

    func get(_ request: Request) -> Response {
        let decided: ReleaseRow, granted: Authorization
        switch decideRelease(request) {
        case .answered(let response): return response
        case .granted(let r, let a): (decided, granted) = (r, a)
        }
        defer { granted.wipe() }
        // Open, then audit, then release: nothing leaves before its entry is committed.
        let opened = release(decided.item, request, method: granted.method, appPassword: granted.appPassword, decided: decided)
        return answer(request, decided.item, opened)
    }

    /// `get` for the event loop, for a request whose gate needs no conversation and no wait
    /// (`forWorker`, which looked `found` up): the same decision, the release committed without waiting, and
    /// `then` given the response: on this thread when the gate answered, else on the thread that
    /// led the commit, or, when the release failed (its denial is audited, which waits for a
    /// commit), on whatever `offload` runs it.
    func getWithoutWaiting(_ request: Request, found: ReleaseRow, offload: @escaping (@escaping () -> Void) -> Void,
                           then: @escaping (Response) -> Void) {
        switch decideRelease(request, found: found) {
        case .answered(let response): then(response)
        case .granted(let decided, let granted):
            releaseWithoutWaiting(decided.item, request, method: granted.method, appPassword: granted.appPassword,
                                  decided: decided) { opened in
                granted.wipe()
                if case .success = opened { return then(answer(request, decided.item, opened)) }
                offload { then(answer(request, decided.item, opened)) }
            }
        }
    }

    /// A `get`'s response once its release is settled.
    private func answer(_ request: Request, _ item: StoredItem, _ opened: Result<Opened, Denial>) -> Response {
        switch opened {
        case .success(let opened):
            var r = Response(.ok)
            r.secret = opened.secret
            r.generation = opened.current.generation
            r.expires = opened.current.expires
            return r
        case .failure(let d):
            if d.outcome == .auditUnavailable {
                broker.log("audit entry could not be written; release refused")
                return Response(.auditUnavailable)
            }
            return deny(request, .get, item: item, d)
        }
    }
}
