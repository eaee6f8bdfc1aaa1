import Glibc
import KeyholdAuth
import KeyholdCore
import KeyholdVault
import KeyholdProtocol

/// The item writes of a session (`put`, `delete`): each looks the item up under the caller's
/// uid, lets the release gate decide on its current policy, and acts through `Broker.transact`
/// (audit, then act).
extension Session {
    static let sealingBusy = Denial(.busy, "another item of this user is being sealed under an application password; try again when it ends")

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
        let biometryState: [UInt8]?
        switch broker.gate.biometryBinding(for: policy, user: caller.userName) {
        case .failure(let d): return deny(request, op, item: existing, d)
        case .success(let binding): biometryState = binding
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
        broker.gate.authorizeOwner(of: ref, caller: caller, request: request, via: conversation, store: broker)
    }
}
