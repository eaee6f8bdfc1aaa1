import Glibc
import KeyholdAuth
import KeyholdCore
import KeyholdVault
import KeyholdProtocol

/// The item operations of a session: each looks the item up under the caller's uid, lets the
/// release gate decide, and acts through `Broker.transact` (audit, then act).
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
        return release.settle(broker.transact(release.record, release.work, discard: { $0.secret.wipe() }))
    }

    /// `release` of a `get` without waiting for the commit (the event loop's): `then` gets what
    /// `release` would return, on the thread that led the commit, and must not block.
    func releaseWithoutWaiting(_ item: StoredItem, _ request: Request, method: AuthMethod, appPassword: AppPasswordKey?,
                               decided: ReleaseRow, then: @escaping (Result<Opened, Denial>) -> Void) {
        let release = PendingRelease(self, item, request, method: method, appPassword: appPassword, decided: decided)
        broker.transactWithoutWaiting(release.record, release.work, discard: { $0.secret.wipe() }) { then(release.settle($0)) }
    }

    /// A release's entry and the writer's part of it, built once for either way of committing.
    private struct PendingRelease {
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
            // new secret.
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

    func put(_ request: Request) -> Response {
        guard let ref = request.item, let secret = request.secret else { return Response(.usage) }
        let op: AuditEvent.Operation = request.update ? .update : .put
        let policy: Policy
        do throws(Policy.ParseError) {
            policy = try Policy(parsing: request.policy ?? "none")
        } catch {
            return deny(request, op, item: nil, Denial(.usage, error.description))
        }
        guard policy.requiresAppPassword == (request.appPassword != nil) else {
            return deny(request, op, item: nil, Denial(.usage, policy.requiresAppPassword
                ? "policy needs an application password" : "an application password needs a +app-password policy"))
        }
        for exe in request.allowedExecutables where !exe.hasPrefix("/") {
            return deny(request, op, item: nil, Denial(.usage, "--allow-exe needs an absolute path"))
        }
        if let label = request.label, label.utf8.count > Limits.maxTextBytes {
            return deny(request, op, item: nil, Denial(.usage, "label too long"))
        }
        let access = AccessControl(policy: policy, allowedExecutables: request.allowedExecutables, reuseSeconds: request.reuseSeconds)

        var existing: StoredItem?
        switch lookup(ref) {
        case .failure(let d):
            // A damaged item may still be replaced with --update: its old policy cannot be
            // checked, so only its owner's uid (already scoped) and a fresh authentication by
            // the new policy stand in. Refuse instead: nothing is silently overwritten.
            return deny(request, op, item: nil, d)
        case .success(let e): existing = e
        }
        if existing == nil, let g = request.ifGeneration {
            // "Only if still at generation G": an item that is gone is not at G, and is not recreated.
            return deny(request, op, item: nil, Denial(.conflict, "the item does not exist (expected generation \(g))"))
        }
        if let found = existing, request.update {
            switch settledForUpdate(request, ref, found) {  // --if-generation; waits for a rotation in progress
            case .failure(let d): return deny(request, op, item: found, d)
            case .success(let e): existing = e
            }
        }
        var method = AuthMethod.none
        if let existing {
            guard request.update else { return deny(request, .put, item: existing, Denial(.duplicateItem)) }
            // Changing a protected item needs its *old* policy satisfied first.
            switch satisfyCurrentPolicy(of: existing, request) {
            case .failure(let d): return deny(request, op, item: existing, d)
            case .success(let m): method = m
            }
        }
        var biometryState: [UInt8]?
        if policy.bindsBiometrySet {
            guard case .enrolled(_, let digest) = broker.gate.domainState(user: caller.userName) else {
                return deny(request, op, item: existing, Denial(.authenticationFailed, "no finger is enrolled for this account"))
            }
            biometryState = digest.bytes
        }
        // Argon2id for a new application password runs here, before the store is locked; one
        // per uid at a time, within the process's derivation slots.
        var sealingKey: AppPasswordKey?
        if let password = request.appPassword {
            guard broker.sealing.reserve(caller.uid) else { return deny(request, op, item: existing, Self.sealingBusy) }
            defer { broker.sealing.release(caller.uid) }
            do throws(StoreError) {
                sealingKey = try AppPasswordKey.sealing(password: password, strength: broker.passwordHashing)
            } catch {
                return deny(request, op, item: existing, Denial(error.outcome))
            }
        }
        defer { sealingKey?.wipe() }
        let newItem = NewItem(service: ref.service, account: ref.account, label: request.label ?? "", kind: request.kind,
                              access: access, biometryState: biometryState, expires: request.expires)
        let audit = event(request, op, item: existing, decision: .granted, method: method, outcome: .ok).record()
        let result = broker.transact(audit) { (store) throws(StoreError) -> StoredItem in
            if let existing {
                return try store.replace(existing, with: newItem, secret: secret, appPassword: sealingKey, audit: audit)
            }
            return try store.add(owner: caller.uid, newItem, secret: secret, appPassword: sealingKey, audit: audit)
        }.mapError { Denial($0.outcome) }
        switch result {
        case .success: return Response(.ok)
        case .failure(let d) where d.outcome == .auditUnavailable: return Response(.auditUnavailable)
        case .failure(let d): return deny(request, op, item: existing, d)
        }
    }

    /// What changing or removing an item needs: its current policy (allowed executables, PAM,
    /// reuse) and, for `+app-password`, its application password — the gate's whole decision.
    func satisfyCurrentPolicy(of existing: StoredItem, _ request: Request) -> Result<AuthMethod, Denial> {
        authorize(existing, request).map { granted in
            granted.wipe()
            return granted.method
        }
    }

    func delete(_ request: Request) -> Response {
        guard let ref = request.item else { return Response(.usage) }
        let item: StoredItem
        switch lookup(ref) {
        case .failure(let d) where d.outcome == .integrityFailure:
            return deleteWithOwnerPassword(request, ref, intact: nil)
        case .failure(let d): return deny(request, .delete, item: nil, d)
        case .success(nil): return deny(request, .delete, item: nil, Denial(.notFound))
        case .success(let found?): item = found
        }
        // Unlike SecItemDelete, a gated item is removed only after its policy is satisfied:
        // otherwise `rm` and `put` would replace it without the policy (issue 8, item 5).
        var method = AuthMethod.none
        switch satisfyCurrentPolicy(of: item, request) {
        case .failure(let d) where d.outcome == .invalidated:
            // Its policy can never be satisfied again: its owner clears it with their password.
            return deleteWithOwnerPassword(request, ref, intact: item)
        case .failure(let d): return deny(request, .delete, item: item, d)
        case .success(let m): method = m
        }
        let audit = event(request, .delete, item: item, decision: .granted, method: method, outcome: .ok).record()
        let result = broker.transact(audit) { (store) throws(StoreError) in
            try store.delete(item, audit: audit)
        }.mapError { Denial($0.outcome) }
        switch result {
        case .success: return Response(.ok)
        case .failure(let d) where d.outcome == .auditUnavailable: return Response(.auditUnavailable)
        case .failure(let d): return deny(request, .delete, item: item, d)
        }
    }

    /// `rm` of an item whose policy cannot be checked any more: one that no longer opens
    /// (`intact` nil: the row the caller's own blind index names is removed, audited as an
    /// error with the integrity outcome) or one that is invalidated. Either needs the owner's
    /// account password first, so a same-user program cannot clear a damaged item and store
    /// its own under the name without the person.
    func deleteWithOwnerPassword(_ request: Request, _ ref: ItemReference, intact: StoredItem?) -> Response {
        let method: AuthMethod
        switch ownerPassword(ref, request) {
        case .failure(let d): return deny(request, .delete, item: intact, d)
        case .success(let m): method = m
        }
        let audit = intact == nil
            ? event(request, .delete, decision: .error, method: method, outcome: .integrityFailure).record()
            : event(request, .delete, item: intact, decision: .granted, method: method, outcome: .ok).record()
        let result = broker.transact(audit) { (store) throws(StoreError) in
            if let intact {
                try store.delete(intact, audit: audit)
            } else {
                try store.deleteDamaged(owner: caller.uid, service: ref.service, account: ref.account, audit: audit)
            }
        }.mapError { Denial($0.outcome) }
        switch result {
        case .success:
            return Response(.ok, detail: intact == nil ? "the item was damaged; it has been removed" : nil)
        case .failure(let d) where d.outcome == .auditUnavailable:
            return Response(.auditUnavailable)
        case .failure(let d): return deny(request, .delete, item: intact, d)
        }
    }

    /// The caller's own account password (stack keyhold-passcode), counted like any attempt.
    func ownerPassword(_ ref: ItemReference, _ request: Request) -> Result<AuthMethod, Denial> {
        broker.gate.authorizeOwner(of: ref, caller: caller, request: request, via: SocketConversation(fd: fd), store: broker)
    }

    /// Metadata of the caller's items, read and sent page by page: the long-read reader is held
    /// only while a page is read, and the client decodes one page while the next is read.
    func list(_ request: Request) -> Response {
        guard broker.audit(event(request, .list, decision: .granted, outcome: .ok)) else { return Response(.auditUnavailable) }
        return sendPages(failure: "the item list could not be read") { source, cursor throws(StoreError) in
            try source.items(owner: caller.uid, after: cursor, limit: Self.itemsPerPage)
        }
    }

    /// The caller's items whose attribute map holds every query pair (the store's index finds
    /// candidates, each is opened and matched exactly under the caller's uid). Audited like
    /// `list`: one entry per request, before anything is sent, with no names in it.
    func search(_ request: Request) -> Response {
        guard broker.audit(event(request, .search, decision: .granted, outcome: .ok)) else { return Response(.auditUnavailable) }
        return sendPages(failure: "the items could not be searched") { source, cursor throws(StoreError) in
            try source.search(owner: caller.uid, attributes: request.searchAttributes, after: cursor, limit: Self.itemsPerPage)
        }
    }

    static let sealingBusy = Denial(.busy, "another item of this user is being sealed under an application password; try again when it ends")

    /// Rows read per page by `list` and `search`. Pages run on the long-read reader
    /// (`Broker.longRead`), which is let go between pages, so other callers' long reads
    /// interleave with a long one.
    static let itemsPerPage = 500

    /// Reads pages with `read` and sends each as `.items` frames.
    private func sendPages(failure: String, _ read: (any LongReads, VaultStore.ItemPageCursor?) throws(StoreError)
                               -> VaultStore.ItemPage) -> Response {
        var count = 0, damaged = 0, socketFailed = false
        let unread = eachPage(read) { found in
            guard sendItems(found.items) else { socketFailed = true; return false }
            count += found.items.count
            damaged += found.damaged
            return true
        }
        if unread { return Response(.otherError, detail: failure) }
        if socketFailed { return Response(.otherError) }
        var r = Response(.ok, detail: damaged > 0 ? "\(damaged) damaged item(s) could not be read" : nil)
        r.count = UInt64(count)
        return r
    }

    /// Reads pages with `read` on the long-read reader, one at a time, and hands each to `body`
    /// until the last or until `body` says stop (false). True when a page could not be read.
    private func eachPage(_ read: (any LongReads, VaultStore.ItemPageCursor?) throws(StoreError) -> VaultStore.ItemPage,
                          _ body: (VaultStore.ItemPage) -> Bool) -> Bool {
        var cursor: VaultStore.ItemPageCursor?
        repeat {
            let page = broker.longRead { [cursor] (source) throws(StoreError) in try read(source, cursor) }
            guard case .success(let found) = page else { return true }
            guard body(found) else { return false }
            cursor = found.next
        } while cursor != nil
        return false
    }

    /// Metadata (never a secret) as `.items` frames; false when the socket failed.
    private func sendItems(_ items: [StoredItem]) -> Bool {
        let infos = items.map { i in
            ItemInfo(id: i.id.description, service: i.service, account: i.account, label: i.label, kind: i.kind,
                     policy: i.access.policy.description, allowedExecutables: i.access.allowedExecutables,
                     reuseSeconds: i.access.reuseSeconds, createdAt: i.createdAt, updatedAt: i.updatedAt,
                     generation: i.generation, expires: i.expires)
        }
        for payload in BrokerMessage.encodedItemBatches(infos) {
            do throws(FrameError) {
                try Frame.write(payload, to: fd)
            } catch {
                return false
            }
        }
        return true
    }

    func state(_ request: Request) -> Response {
        guard let ref = request.item else { return Response(.usage) }
        var r = Response(.ok)
        switch lookup(ref) {
        case .failure(let d): return deny(request, .state, item: nil, d)
        case .success(nil):
            r.state = "not-found"
            guard broker.audit(event(request, .state, decision: .granted, outcome: .notFound)) else { return Response(.auditUnavailable) }
            return r
        case .success(let item?):
            let availability = broker.gate.preview(item, caller: caller)
            // The lockout matters only to an item a get would authenticate for (as `get`: an
            // unreadable record refuses that one, never an item that needs no one).
            if availability == .requiresAuthentication {
                switch broker.gate.lockoutLeft(uid: caller.uid, store: broker) {
                case .success(let left): r.secondsLeft = left
                case .failure(let d): return deny(request, .state, item: item, d)
                }
            }
            r.state = availability.rawValue
            // Past its expiry the item is still released (the caller decides); `state` says so.
            if availability != .invalidated, let expires = item.expires, expires <= currentMicroseconds() { r.state = "expired" }
            r.generation = item.generation
            r.expires = item.expires
            guard broker.audit(event(request, .state, item: item, decision: .granted, outcome: .ok)) else { return Response(.auditUnavailable) }
            return r
        }
    }

    /// Anyone may ask how the vault is protected; nothing about items.
    func status(_ request: Request) -> Response {
        guard broker.audit(event(request, .status, decision: .granted, outcome: .ok)) else { return Response(.auditUnavailable) }
        return Response(.ok, detail: broker.protection.statusText)
    }

    func lock(_ request: Request) -> Response {
        broker.gate.endReuse(uid: caller.uid)
        guard broker.audit(event(request, .lock, decision: .granted, outcome: .ok)) else { return Response(.auditUnavailable) }
        return Response(.ok)
    }

    func biometry(_ request: Request) -> Response {
        var r = Response(.ok)
        switch broker.gate.domainState(user: caller.userName) {
        case .unreadable: r.detail = "fprintd's print store is not readable by the broker"
        case .noneEnrolled: break
        case .enrolled(let fingers, _): r.fingers = fingers
        }
        // The reader's name is not asked here: the root broker keeps no D-Bus client (the CLI
        // asks fprintd itself, as the user).
        // Counted page by page on the long-read reader, as `list` reads (a listing that cannot
        // be read counts nothing, as before).
        var bound = 0
        let unread = eachPage({ source, cursor throws(StoreError) in
            try source.items(owner: caller.uid, after: cursor, limit: Self.itemsPerPage)
        }) { found in
            bound += found.items.filter { $0.access.policy.bindsBiometrySet }.count
            return true
        }
        r.count = unread ? 0 : UInt64(bound)
        guard broker.audit(event(request, .biometry, decision: .granted, outcome: .ok)) else { return Response(.auditUnavailable) }
        return r
    }
}
