import KeyholdCore
import KeyholdVault
import KeyholdProtocol

/// The release path of a session (`get`, and `rotate`'s release): the item looked up under the
/// caller's uid, the release gate's decision, then, under the writer, the row read again, its
/// secret opened and the release's audit entry appended in one transaction of a group commit
/// (`Broker.transact`), committed before the secret is answered. This is the only place a
/// secret is opened for a caller.
extension Session {
    /// What a release starts with (`get`, `rotate`): the item the request names, looked up
    /// under the caller's uid, and the gate's whole decision on it; or the (audited) refusal.
    enum Decision {
        case granted(StoredItem, Authorization)
        case answered(Response)
    }

    func decideRelease(_ request: Request) -> Decision {
        guard let ref = request.item else { return .answered(Response(.usage)) }
        let item: StoredItem
        switch lookup(ref) {
        case .failure(let d): return .answered(deny(request, .get, item: nil, d))
        case .success(nil): return .answered(deny(request, .get, item: nil, Denial(.notFound)))
        case .success(let found?): item = found
        }
        if let d = refusedThroughAgent(item, request) { return .answered(deny(request, .get, item: item, d)) }
        switch authorize(item, request) {
        case .failure(let d): return .answered(deny(request, .get, item: item, d))
        case .success(let granted): return .granted(item, granted)
        }
    }

    typealias Opened = (secret: SecureBytes, current: StoredItem)

    /// Opens the secret and commits its release entry; nothing is returned before that entry is
    /// in. The row is read again under the writer and must still carry the access the gate
    /// judged on `item` (else *conflict*): a policy tightened while the gate ran never releases
    /// the new secret. A rotation's release records its lease (`leaseUntil`) in the same
    /// transaction, so a secret never leaves for a COMMAND without a lease a restarted broker honours.
    func release(_ item: StoredItem, _ request: Request, method: AuthMethod, appPassword: AppPasswordKey?,
                 leaseUntil: Int64? = nil) -> Result<Opened, Denial> {
        // Only a row of the request table that releases may (`RequestKind.releases`).
        guard kind?.releases == true else { return .failure(Denial(.otherError)) }
        let record = event(request, .get, item: item, decision: .granted, method: method, outcome: .ok).record()
        let result = broker.transact(record, { (store) throws(StoreError) -> Opened in
            let opened = try store.openCurrentSecret(item, appPassword: appPassword)
            do throws(StoreError) {
                if let leaseUntil { try store.recordRotationLease(item.id, until: leaseUntil) }
                try store.append(record)
            } catch {
                opened.secret.wipe()
                throw error
            }
            return opened
        }, discard: { $0.secret.wipe() })
        switch result {
        case .success(let opened): return .success(opened)
        case .failure(.appPasswordWrong): return .failure(Denial(.authenticationFailed, "wrong application password"))
        case .failure(let error): return .failure(Denial(error.outcome))
        }
    }

    func get(_ request: Request) -> Response {
        let item: StoredItem, granted: Authorization
        switch decideRelease(request) {
        case .answered(let response): return response
        case .granted(let i, let a): (item, granted) = (i, a)
        }
        defer { granted.wipe() }
        // Open, then audit, then release: nothing leaves before its entry is committed.
        switch release(item, request, method: granted.method, appPassword: granted.appPassword) {
        case .success(let opened):
            var r = Response(.ok)
            r.secret = opened.secret
            r.generation = opened.current.generation
            r.expires = opened.current.expires
            return r
        case .failure(let d) where d.outcome == .auditUnavailable:
            broker.log("audit entry could not be written; release refused")
            return Response(.auditUnavailable)
        case .failure(let d):
            return deny(request, .get, item: item, d)
        }
    }
}
