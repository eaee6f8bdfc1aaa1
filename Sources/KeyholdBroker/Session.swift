import Glibc
import KeyholdAuth
import KeyholdCore
import KeyholdVault
import KeyholdProtocol

/// One client connection: one request, its conversation, one response. Every request the
/// broker answers produces exactly one audit entry, and for a release that entry is committed
/// before the secret is written to the socket.
struct Session {
    let fd: Int32
    let caller: Caller
    let broker: Broker

    /// How long a client may take: its whole request (from accept), an answer to a prompt
    /// (a person typing), and any other frame after the first byte may be idle before it.
    enum Deadlines {
        static let requestMilliseconds = 5_000
        static let answerMilliseconds = 120_000
        static let idleMilliseconds = 5_000
        static let frameMilliseconds = 10_000
    }

    /// Serves one accepted connection: reads the request within its deadline, identifies the
    /// process that sent it (not only the one that connected), and answers.
    static func serve(fd: Int32, peer: Peer, broker: Broker) {
        var reader = TimedFrameReader(fd: fd)
        let payload: SecureBytes
        do throws(FrameError) {
            let ms = Deadlines.requestMilliseconds
            guard let p = try reader.read(idleMilliseconds: ms, frameMilliseconds: ms) else { return }  // connected and left
            payload = p
        } catch {
            Session(fd: fd, caller: .identify(socket: fd, peer: peer), broker: broker).rejectMalformed(error)
            return
        }
        let caller = Caller.identify(socket: fd, peer: peer, senders: reader.senders)
        Session(fd: fd, caller: caller, broker: broker).run(payload, senderUIDs: reader.senders.map(\.uid))
    }

    func run(_ payload: SecureBytes, senderUIDs: [UInt32]) {
        let message: ClientMessage
        do throws(FrameError) {
            message = try ClientMessage.decode(payload)
        } catch {
            rejectMalformed(error)
            return
        }
        payload.wipe()
        guard case .request(let request) = message else {
            rejectMalformed(.unexpectedMessage)
            return
        }
        // A vault seen rolled back while serving: nothing more (RollbackWatch.swift).
        if let refused = broker.rollbackAnswer() {
            send(.response(refused))
            request.secret?.wipe()
            request.appPassword?.wipe()
            return
        }
        // Over this uid's audit budget: not carried out, counted for its refused-burst entry.
        guard broker.budget.admit(uid: caller.uid) else {
            send(.response(Response(.busy, detail: "too many requests from this user; try again shortly")))
            request.secret?.wipe()
            request.appPassword?.wipe()
            return
        }
        let response: Response
        if senderUIDs.contains(where: { $0 != caller.uid }) {
            // A connection handed to another user's process: neither may act through it.
            response = deny(request, .invalid, item: nil, Denial(.notAuthorized, "the request was sent by another user than the one that connected"))
        } else {
            response = broker.rollbackAnswer(replacing: handle(request))!
        }
        send(.response(response))
        response.secret?.wipe()
        request.secret?.wipe()
        request.appPassword?.wipe()
    }

    /// A frame that could not be parsed gets an error frame (when the socket still works), an
    /// audit entry, and the connection is closed by the caller of `run`.
    fileprivate func rejectMalformed(_ error: FrameError) {
        guard broker.budget.admit(uid: caller.uid) else { return }  // counted for its refused-burst entry
        let outcome: Outcome = .usage
        broker.audit(AuditEvent(caller: caller, operation: .invalid, decision: .error, outcome: outcome))
        if case .io = error { return }
        send(.response(Response(outcome, detail: "rejected request: \(error)")))
    }

    @discardableResult
    func send(_ message: BrokerMessage) -> Bool {
        do throws(FrameError) {
            try Frame.write(message.encode(), to: fd)
            return true
        } catch {
            return false
        }
    }

    // MARK: dispatch

    private func handle(_ request: Request) -> Response {
        // Item writes stop short of the free-space reserve; audit entries may still use it.
        if request.operation == .put {
            if broker.reserve.isLow {
                return deny(request, request.update ? .update : .put, item: nil,
                            Denial(.otherError, "refused: the vault's file system is below the broker's free-space reserve"))
            }
            // What an item write can add (sealed secret and texts) counts against the uid's budget too.
            let texts = [request.label, request.item?.service, request.item?.account].reduce(0) { $0 + ($1?.utf8.count ?? 0) }
            broker.budget.charge(uid: caller.uid, bytes: (request.secret?.count ?? 0) + (request.appPassword?.count ?? 0) + texts + 512)
        }
        var request = request
        switch checkClaim(request) {
        case .none: break
        case .claimed(let r): request = r
        case .refused(let d): return deny(request, .invalid, item: nil, d)
        }
        switch request.operation {
        case .put: return put(request)
        case .get: return get(request)
        case .delete: return delete(request)
        case .list: return list(request)
        case .state: return state(request)
        case .lock: return lock(request)
        case .biometry: return biometry(request)
        case .audit: return request.withRows ? auditExport(request) : auditQuery(request)
        case .auditVerify: return auditVerify(request)
        case .auditPrune: return auditPrune(request)
        case .auditVerifyExport: return auditVerifyExport(request)
        case .status: return status(request)
        case .rotate: return rotate(request)
        }
    }

    func event(_ request: Request, _ op: AuditEvent.Operation, item: StoredItem? = nil,
                       decision: AuditEvent.Decision, method: AuthMethod = .none, outcome: Outcome) -> AuditEvent {
        AuditEvent(caller: caller, operation: op, itemID: item?.id, item: request.item, decision: decision,
                   method: method, reason: request.reason, outcome: outcome)
    }

    /// Answers with `denial`, auditing it first.
    func deny(_ request: Request, _ op: AuditEvent.Operation, item: StoredItem?, _ denial: Denial) -> Response {
        let decision: AuditEvent.Decision = [.integrityFailure, .otherError, .auditUnavailable].contains(denial.outcome) ? .error : .denied
        if !broker.audit(event(request, op, item: item, decision: decision, outcome: denial.outcome)) {
            return Response(.auditUnavailable)
        }
        var r = Response(denial.outcome, detail: denial.detail)
        r.secondsLeft = denial.secondsLeft
        return r
    }

    /// Looks the item up for the caller's uid only: another user's item is simply not there.
    func lookup(_ ref: ItemReference) -> Result<StoredItem?, Denial> {
        broker.withStore { store in
            do throws(StoreError) {
                return .success(try store.item(owner: caller.uid, service: ref.service, account: ref.account))
            } catch {
                return .failure(Denial(error.outcome))
            }
        }
    }

    /// The release gate's whole decision for this caller (ReleaseGate.swift); the session only
    /// carries its conversation over this socket. The caller wipes the authorization.
    func authorize(_ item: StoredItem, _ request: Request) -> Result<Authorization, Denial> {
        broker.gate.authorize(item, caller: caller, request: request, via: SocketConversation(fd: fd), store: broker)
    }

    // MARK: operations

    private func get(_ request: Request) -> Response {
        guard let ref = request.item else { return Response(.usage) }
        let item: StoredItem
        switch lookup(ref) {
        case .failure(let d): return deny(request, .get, item: nil, d)
        case .success(nil): return deny(request, .get, item: nil, Denial(.notFound))
        case .success(let found?): item = found
        }
        if let d = refusedThroughAgent(item, request) { return deny(request, .get, item: item, d) }
        let granted: Authorization
        switch authorize(item, request) {
        case .failure(let d): return deny(request, .get, item: item, d)
        case .success(let a): granted = a
        }
        defer { granted.wipe() }

        // Open, then audit, then release: nothing leaves before its entry is committed.
        let record = event(request, .get, item: item, decision: .granted, method: granted.method, outcome: .ok).record()
        let opened: Result<SecureBytes, Denial>
        switch broker.transact(record, { (store) throws(StoreError) -> SecureBytes in
            let secret = try store.openSecret(item, appPassword: granted.appPassword)
            do throws(StoreError) { try store.append(record) } catch { secret.wipe(); throw error }
            return secret
        }, discard: { $0.wipe() }) {
        case .success(let secret): opened = .success(secret)
        case .failure(.appPasswordWrong): opened = .failure(Denial(.authenticationFailed, "wrong application password"))
        case .failure(let error): opened = .failure(Denial(error.outcome))
        }
        switch opened {
        case .success(let secret):
            var r = Response(.ok)
            r.secret = secret
            r.generation = item.generation
            r.expires = item.expires
            return r
        case .failure(let d):
            if d.outcome == .auditUnavailable {
                broker.log("audit entry could not be written; release refused")
                return Response(.auditUnavailable)
            }
            return deny(request, .get, item: item, d)
        }
    }

    private func put(_ request: Request) -> Response {
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
        let newItem = NewItem(service: ref.service, account: ref.account, label: request.label ?? "", kind: request.kind,
                              access: access, biometryState: biometryState, expires: request.expires)
        let audit = event(request, op, item: existing, decision: .granted, method: method, outcome: .ok).record()
        let result = broker.transact(audit) { (store) throws(StoreError) -> StoredItem in
            if let existing {
                return try store.replace(existing, with: newItem, secret: secret, appPassword: request.appPassword, audit: audit)
            }
            return try store.add(owner: caller.uid, newItem, secret: secret, appPassword: request.appPassword, audit: audit)
        }.mapError { Denial($0.outcome) }
        switch result {
        case .success: return Response(.ok)
        case .failure(let d) where d.outcome == .auditUnavailable: return Response(.auditUnavailable)
        case .failure(let d): return deny(request, op, item: existing, d)
        }
    }

    /// What changing or removing an item needs: its current policy (allowed executables, PAM,
    /// reuse) and, for `+app-password`, its application password — the gate's whole decision.
    private func satisfyCurrentPolicy(of existing: StoredItem, _ request: Request) -> Result<AuthMethod, Denial> {
        authorize(existing, request).map { granted in
            granted.wipe()
            return granted.method
        }
    }

    private func delete(_ request: Request) -> Response {
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
    private func deleteWithOwnerPassword(_ request: Request, _ ref: ItemReference, intact: StoredItem?) -> Response {
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
    private func ownerPassword(_ ref: ItemReference, _ request: Request) -> Result<AuthMethod, Denial> {
        broker.gate.authorizeOwner(of: ref, caller: caller, request: request, via: SocketConversation(fd: fd), store: broker)
    }

    /// Metadata of the caller's items, read and sent page by page: the store is held only
    /// while a page is read, and the client decodes one page while the next is read.
    private func list(_ request: Request) -> Response {
        guard broker.audit(event(request, .list, decision: .granted, outcome: .ok)) else { return Response(.auditUnavailable) }
        var cursor: VaultStore.ItemPageCursor?
        var count = 0, damaged = 0
        repeat {
            let page: Result<(items: [StoredItem], damaged: Int, next: VaultStore.ItemPageCursor?), Denial> = broker.withStore { store in
                do throws(StoreError) {
                    return .success(try store.items(owner: caller.uid, after: cursor, limit: 2000))
                } catch {
                    return .failure(Denial(error.outcome))
                }
            }
            guard case .success(let found) = page else { return Response(.otherError, detail: "the item list could not be read") }
            let infos = found.items.map { i in
                ItemInfo(id: i.id.description, service: i.service, account: i.account, label: i.label, kind: i.kind,
                         policy: i.access.policy.description, allowedExecutables: i.access.allowedExecutables,
                         reuseSeconds: i.access.reuseSeconds, createdAt: i.createdAt, updatedAt: i.updatedAt,
                         generation: i.generation, expires: i.expires)
            }
            for payload in BrokerMessage.encodedItemBatches(infos) {
                do throws(FrameError) {
                    try Frame.write(payload, to: fd)
                } catch {
                    return Response(.otherError)
                }
            }
            count += infos.count
            damaged += found.damaged
            cursor = found.next
        } while cursor != nil
        var r = Response(.ok, detail: damaged > 0 ? "\(damaged) damaged item(s) could not be read" : nil)
        r.count = UInt64(count)
        return r
    }

    private func state(_ request: Request) -> Response {
        guard let ref = request.item else { return Response(.usage) }
        var r = Response(.ok)
        switch broker.gate.lockoutLeft(uid: caller.uid, store: broker) {
        case .success(let left): r.secondsLeft = left
        case .failure(let d): return deny(request, .state, item: nil, d)
        }
        switch lookup(ref) {
        case .failure(let d): return deny(request, .state, item: nil, d)
        case .success(nil):
            r.state = "not-found"
            guard broker.audit(event(request, .state, decision: .granted, outcome: .notFound)) else { return Response(.auditUnavailable) }
            return r
        case .success(let item?):
            let availability = broker.gate.preview(item, caller: caller)
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
    private func status(_ request: Request) -> Response {
        guard broker.audit(event(request, .status, decision: .granted, outcome: .ok)) else { return Response(.auditUnavailable) }
        return Response(.ok, detail: broker.protection.statusText)
    }

    private func lock(_ request: Request) -> Response {
        broker.gate.endReuse(uid: caller.uid)
        guard broker.audit(event(request, .lock, decision: .granted, outcome: .ok)) else { return Response(.auditUnavailable) }
        return Response(.ok)
    }

    private func biometry(_ request: Request) -> Response {
        var r = Response(.ok)
        switch broker.gate.domainState(user: caller.userName) {
        case .unreadable: r.detail = "fprintd's print store is not readable by the broker"
        case .noneEnrolled: break
        case .enrolled(let fingers, _): r.fingers = fingers
        }
        r.reader = BiometryStore.readerDescription()
        let bound: Int = broker.withStore { store in
            ((try? store.items(owner: caller.uid))?.items ?? []).filter { $0.access.policy.bindsBiometrySet }.count
        }
        r.count = UInt64(bound)
        guard broker.audit(event(request, .biometry, decision: .granted, outcome: .ok)) else { return Response(.auditUnavailable) }
        return r
    }

    /// Audit entries the caller may see: their own requests (root: all). With `follow`, keeps
    /// sending new entries until the caller goes away.
    private func auditQuery(_ request: Request) -> Response {
        // The query's own entry names no item: a filter is not an access to the item.
        var unfiltered = request
        unfiltered.item = nil
        guard broker.audit(event(unfiltered, .auditRead, decision: .granted, outcome: .ok)) else { return Response(.auditUnavailable) }
        let visibleTo: UInt32? = caller.uid == 0 ? nil : caller.uid
        let filter = request.item.map { (service: $0.service, account: $0.account) }
        var afterSeq = request.afterSeq
        // A user numbers entries among their own (see auditEntries): resume after their own number.
        if let uid = visibleTo, let own = request.afterSeq {
            let translated: Int64? = broker.withStore { store in try? store.auditSeq(uid: uid, own: own) }
            guard let translated else { return Response(.auditUnavailable, detail: "the audit log could not be read") }
            afterSeq = translated
        }
        var sent = 0
        while true {
            let page: Result<[AuditEntryView], Denial> = broker.withStore { store in
                do throws(StoreError) {
                    return .success(try store.auditEntries(visibleTo: visibleTo, since: request.since, item: filter,
                                                           afterSeq: afterSeq, limit: 5000))
                } catch {
                    return .failure(Denial(error.outcome))
                }
            }
            guard case .success(let views) = page else { return Response(.auditUnavailable, detail: "the audit log could not be read") }
            var infos: [AuditEntryInfo] = []
            var reachedUntil = false
            for v in views {
                if let until = request.until, v.time > until { reachedUntil = true; break }
                // Only root sees the log's own numbering and MACs; a user, their own numbers.
                infos.append(AuditEntryInfo(
                    seq: v.ownSeq ?? v.seq, time: v.time, uid: v.callerUID, pid: v.callerPID, executable: v.executable,
                    operation: v.operation, itemID: v.itemID?.description, service: v.service, account: v.account,
                    decision: v.decision, method: v.method, reason: v.reason, outcome: v.outcome,
                    mac: visibleTo == nil ? Hex.encode(v.mac) : "", previousMAC: ""))
            }
            for batch in BrokerMessage.auditBatches(infos) {
                guard send(batch) else { return Response(.ok) }
            }
            sent += infos.count
            if let last = views.last { afterSeq = last.seq }
            if reachedUntil { break }
            if views.count == 5000 { continue }
            guard request.follow else { break }
            // Following: wait for new entries, or for the caller to leave (readable = EOF/cancel).
            var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            if poll(&pfd, 1, 250) != 0 { return Response(.ok) }
        }
        var r = Response(.ok)
        r.count = UInt64(sent)
        return r
    }

    /// Checks the whole chain. Root is told how many entries and where it breaks; a user is
    /// told about their own entries only (how many, and where only if the first bad entry is
    /// theirs), so verifying reveals nothing of others' activity.
    private func auditVerify(_ request: Request) -> Response {
        let visibleTo: UInt32? = caller.uid == 0 ? nil : caller.uid
        let result: Result<(AuditVerification, count: Int64, badOwn: Int64?), Denial> = broker.withStore { store in
            do throws(StoreError) {
                let v = try store.verifyAudit()
                guard let uid = visibleTo else {
                    if case .intact(let n) = v { return .success((v, n, nil)) }
                    if case .broken(let seq, _) = v { return .success((v, 0, seq)) }
                    return .success((v, 0, nil))
                }
                let count = try store.auditEntryCount(uid: uid)
                var badOwn: Int64?
                if case .broken(let seq, _) = v { badOwn = try store.auditOwnSeq(uid: uid, seq: seq) }
                return .success((v, count, badOwn))
            } catch {
                return .failure(Denial(error.outcome))
            }
        }
        var r: Response
        switch result {
        case .failure(let d): return deny(request, .auditVerify, item: nil, d)
        case .success((.intact, let count, _)):
            r = Response(.ok)
            r.count = UInt64(count)
        case .success((.broken(_, let problem), _, let bad)):
            r = Response(.integrityFailure, detail: problem.rawValue)
            r.firstBadSeq = bad.map { UInt64(max($0, 0)) }
        }
        // Recorded after the check, so the entry itself is not part of what was verified.
        guard broker.audit(event(request, .auditVerify, decision: .granted, outcome: r.outcome)) else { return Response(.auditUnavailable) }
        return r
    }

    /// Removes entries up to a time, leaving a checkpoint. Root only: the log is everyone's.
    private func auditPrune(_ request: Request) -> Response {
        guard caller.uid == 0 else { return deny(request, .auditPrune, item: nil, Denial(.notAuthorized, "only root may prune the audit log")) }
        guard let until = request.until else { return deny(request, .auditPrune, item: nil, Denial(.usage, "prune needs --until")) }
        let record = event(request, .auditPrune, decision: .granted, outcome: .ok).record()
        let result: Result<Int64, Denial> = broker.withStore { store in
            do throws(StoreError) {
                guard let seq = try store.lastAuditSeq(atOrBefore: until) else { return .success(0) }
                return .success(try store.pruneAudit(throughSeq: seq, audit: record))
            } catch {
                return .failure(Denial(error.outcome))
            }
        }
        switch result {
        case .success(let n):
            if n > 0 { broker.committed(record, true) } else if !broker.audit(event(request, .auditPrune, decision: .granted, outcome: .ok)) {
                return Response(.auditUnavailable)
            }
            var r = Response(.ok)
            r.count = UInt64(n)
            return r
        case .failure(let d) where d.outcome == .auditUnavailable:
            broker.committed(record, false)
            return Response(.auditUnavailable)
        case .failure(let d): return deny(request, .auditPrune, item: nil, d)
        }
    }
}

extension Session {
    /// An export that verifies on its own: its header, then every entry from the chain's start
    /// (genesis or the checkpoint) through the newest at or before `until`, each with its row
    /// bytes and MACs. Root only: the rows carry every user's entries.
    fileprivate func auditExport(_ request: Request) -> Response {
        guard caller.uid == 0 else {
            return deny(request, .auditExport, item: nil, Denial(.notAuthorized, "only root may export the audit log"))
        }
        // The range is fixed before this request's own entry is written, so that entry is not
        // part of the export (it follows it in the chain).
        let prepared: Result<AuditExportHeader, Denial> = broker.withStore { store in
            do throws(StoreError) {
                let through = try store.lastAuditSeq(atOrBefore: request.until ?? Int64.max)
                return .success(try store.auditExportHeader(throughSeq: through))
            } catch {
                return .failure(Denial(error.outcome, error == .integrity ? "the audit checkpoint is damaged; run audit verify" : nil))
            }
        }
        let header: AuditExportHeader
        switch prepared {
        case .failure(let d): return deny(request, .auditExport, item: nil, d)
        case .success(let h): header = h
        }
        guard broker.audit(event(request, .auditExport, decision: .granted, outcome: .ok)) else { return Response(.auditUnavailable) }
        guard send(.auditExportHeader(header)) else { return Response(.otherError) }
        var cursor = (seq: header.startSeq, mac: header.startMAC)
        var sent: UInt64 = 0
        while cursor.seq < header.throughSeq {
            let after = cursor
            let page: Result<[AuditExportRow], StoreError> = broker.withStore { store in
                do throws(StoreError) {
                    return .success(try store.auditExportRows(after: after.seq, previousMAC: after.mac, through: header.throughSeq,
                                                              limit: 2000))
                } catch {
                    return .failure(error)
                }
            }
            switch page {
            case .failure(.integrity), .success([]):
                // Rows are checked against the chain as they are read: no export is vouched for past damage.
                broker.log("audit export stopped: the chain does not verify past entry \(after.seq)")
                return Response(.integrityFailure, detail: "the audit chain does not verify after entry \(after.seq); run audit verify")
            case .failure(let e):
                return Response(e.outcome, detail: "the audit log could not be read")
            case .success(let rows):
                for batch in BrokerMessage.auditBatches(rows.map { AuditEntryInfo($0) }) {
                    guard send(batch) else { return Response(.otherError) }
                }
                sent += UInt64(rows.count)
                cursor = (rows[rows.count - 1].seq, rows[rows.count - 1].mac)
            }
        }
        var r = Response(.ok)
        r.count = sent
        return r
    }

    /// Checks an exported file streamed by the caller (header in the request, then row batches,
    /// then an end marker) with the audit key. Anyone may ask: the answer is only a count or
    /// the first bad seq, and the rows come from the caller.
    fileprivate func auditVerifyExport(_ request: Request) -> Response {
        guard let header = request.exportHeader else {
            return deny(request, .auditVerify, item: nil, Denial(.usage, "export verification needs its header"))
        }
        var verifier = broker.withStore { $0.auditExportVerifier(header) }
        reading: while true {
            let message: ClientMessage
            do throws(FrameError) {
                var reader = TimedFrameReader(fd: fd)
                guard let payload = try reader.read(idleMilliseconds: Deadlines.idleMilliseconds,
                                                    frameMilliseconds: Deadlines.frameMilliseconds) else {
                    return deny(request, .auditVerify, item: nil, Denial(.usage, "the export ended before its end marker"))
                }
                defer { payload.wipe() }
                message = try ClientMessage.decode(payload)
            } catch {
                return deny(request, .auditVerify, item: nil, Denial(.usage, "rejected export rows: \(error)"))
            }
            switch message {
            case .auditRows(let rows):
                // Decoding guarantees each row is complete; after the first bad one the verifier
                // only looks at seqs, so a long tail costs little.
                for info in rows { if let row = info.exportRow { verifier.add(row) } }
            case .auditRowsEnd:
                break reading
            default:
                return deny(request, .auditVerify, item: nil, Denial(.usage, "unexpected message in an export verification"))
            }
        }
        var r: Response
        switch verifier.finish() {
        case .intact(let count):
            r = Response(.ok)
            r.count = UInt64(count)
        case .broken(let seq, let problem):
            r = Response(.integrityFailure, detail: problem.rawValue)
            r.firstBadSeq = UInt64(max(seq, 0))
        }
        guard broker.audit(event(request, .auditVerify, decision: .granted, outcome: r.outcome)) else { return Response(.auditUnavailable) }
        return r
    }
}

