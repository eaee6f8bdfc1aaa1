import Glibc
import KeyholdAuth
import KeyholdCore
import KeyholdVault
import KeyholdProtocol

/// `rotate` over one connection: the item's policy is satisfied once (the same gate as `get`),
/// the rotation lease is taken, the current secret is released (audited first) for the
/// caller's command, and the new secret it sends back is committed at the next generation
/// (audited in the same transaction). Anything else — a cancel, a closed socket, the lease's
/// time running out — commits nothing. The lease ends with a commit or a cancel; a rotation
/// cut off after the release keeps it until its deadline (RotationLeases.swift), recorded in
/// the vault with the release so a restarted broker keeps it too.
///
/// A caller that had to wait for another's lease and finds the item already at a newer
/// generation gets that secret instead (`state` "rotated-elsewhere"): its command never runs,
/// so N callers that want a fresh token at once cause one refresh.
extension Session {
    static let rotatedElsewhere = "rotated-elsewhere"

    func rotate(_ request: Request) -> Response {
        guard let ref = request.item else { return Response(.usage) }
        // A rotation ends in an item write, so it stops short of the free-space reserve as a
        // put does — here, before COMMAND gets the secret: refused at the end, the provider
        // would already have replaced the token and the new one would be lost.
        if broker.reserve.isLow {
            return deny(request, .update, item: nil, .belowReserve)
        }
        let seconds = Int64(request.timeoutSeconds ?? Limits.defaultRotationSeconds) * 1000
        // The gate's whole decision, application password included (checked and counted
        // there), exactly as for `get`.
        let item: StoredItem, granted: Authorization
        switch decideRelease(request) {
        case .answered(let response): return response
        case .granted(let i, let a): (item, granted) = (i, a)
        }
        defer { granted.wipe() }
        let method = granted.method, appPassword = granted.appPassword

        honourRecordedLease(item.id)
        let token: UInt64
        switch broker.leases.acquire(item.id, deadline: MonotonicClock.milliseconds() + seconds, clientFD: fd) {
        case .acquired(let t, _): token = t
        case .timedOut: return deny(request, .get, item: item, Denial(.conflict, "another rotation of this item did not finish in time"))
        case .callerLeft: return deny(request, .get, item: item, Denial(.userCanceled))
        }
        // The lease's lifetime, plus a little so the client's own timeout (which kills its
        // command and cancels) is the one that normally ends it.
        let deadline = MonotonicClock.milliseconds() + seconds + 5_000
        // Once the secret is out, a rotation that ends without a commit or a cancel keeps the
        // lease until `deadline`: its COMMAND may still be redeeming the old secret.
        var keptUntil: Int64?
        defer {
            if let keptUntil { broker.leases.keep(item.id, token: token, until: keptUntil) }
            else { broker.leases.release(item.id, token: token) }
        }

        // What was authorised is the item as first read; under the lease, read it again.
        let current: StoredItem
        switch lookup(ref) {
        case .failure(let d): return deny(request, .get, item: item, d)
        case .success(nil): return deny(request, .get, item: item, Denial(.notFound))
        case .success(let found?): current = found
        }
        guard current.id == item.id, current.access == item.access, current.biometryState == item.biometryState else {
            return deny(request, .get, item: current, Denial(.conflict, "the item's policy changed; ask again"))
        }
        // What was released is the row read again at release (same access, generation ≥):
        // its generation is the one the secret belongs to. The lease is recorded with it.
        let secret: SecureBytes
        let released: StoredItem
        // Already rotated while this caller waited: no COMMAND will run, no lease to record.
        let runsCommand = current.generation == item.generation
        let wallDeadline = runsCommand ? currentMicroseconds() + (seconds + 5_000) * 1_000 : nil
        switch release(current, request, method: method, appPassword: appPassword, leaseUntil: wallDeadline) {
        case .failure(let d): return d.outcome == .auditUnavailable ? Response(.auditUnavailable) : deny(request, .get, item: current, d)
        case .success(let opened): (secret, released) = (opened.secret, opened.current)
        }
        if released.generation != item.generation {
            // Rotated elsewhere: no COMMAND runs on this secret, a recorded lease goes.
            if runsCommand && !forgetRecordedLease(item.id) { keptUntil = deadline }
            var r = Response(.ok)
            r.secret = secret
            r.generation = released.generation
            r.expires = released.expires
            r.state = Self.rotatedElsewhere
            return r
        }
        let offered = send(.rotationCurrent(secret, generation: released.generation))
        secret.wipe()
        switch offered ? awaitRotated(deadline: deadline) : .cutOff {
        case .rotated(let newSecret, let expires):
            defer { newSecret.wipe() }
            let response = commit(released, newSecret, expires: expires, request, method: method, appPassword: appPassword)
            // A failed commit left the row: COMMAND is done (keyhold waited for it), so it goes.
            if response.outcome != .ok && !forgetRecordedLease(item.id) { keptUntil = deadline }
            return response
        case .canceled:
            // keyhold cancels only once its COMMAND has exited or been killed.
            if !forgetRecordedLease(item.id) { keptUntil = deadline }
            return deny(request, .update, item: released, Denial(.userCanceled, "the rotation ended without a new secret; nothing changed"))
        case .cutOff:
            keptUntil = deadline
            return deny(request, .update, item: released, Denial(.userCanceled,
                "the rotation was cut off after the secret was released; nothing changed, the item stays leased until its deadline"))
        }
    }

    private enum RotationEnd {
        case rotated(SecureBytes, Int64?)
        /// The client said so: its COMMAND is no longer running.
        case canceled
        /// The socket closed, the deadline passed, or anything else arrived: COMMAND may run on.
        case cutOff
    }

    /// The client's new secret, its cancel, or a cut-off: a closed socket, the deadline, or a
    /// frame some other user's process wrote into the connection.
    private func awaitRotated(deadline: Int64) -> RotationEnd {
        let left = Int(deadline - MonotonicClock.milliseconds())
        guard left > 0 else { return .cutOff }
        var reader = TimedFrameReader(fd: fd)
        do throws(FrameError) {
            guard let payload = try reader.read(idleMilliseconds: left, frameMilliseconds: left) else {
                return .cutOff
            }
            defer { payload.wipe() }
            guard reader.senders.allSatisfy({ $0.uid == caller.uid }) else { return .cutOff }
            switch try ClientMessage.decode(payload) {
            case .rotated(let s, let expires): return .rotated(s, expires)
            case .cancel: return .canceled
            default: return .cutOff
            }
        } catch {
            return .cutOff
        }
    }

    /// A lease the vault recorded and that has not ended (a rotation cut off, perhaps before
    /// this broker started) is held here too until its end. A clock set back cannot stretch
    /// it past the longest lease.
    private func honourRecordedLease(_ id: ItemID) {
        guard !broker.leases.isHeld(id) else { return }
        guard let until = broker.withStore({ try? $0.rotationLease(id) }) else { return }
        let left = min(until - currentMicroseconds(), (Int64(Limits.maxRotationSeconds) + 5) * 1_000_000)
        guard left > 0 else { return }
        broker.leases.honour(id, until: MonotonicClock.milliseconds() + left / 1_000)
    }

    /// Removes the item's recorded lease; false when that failed (the lease is then kept).
    private func forgetRecordedLease(_ id: ItemID) -> Bool {
        broker.withStore { store in (try? store.clearRotationLease(id)) != nil }
    }

    /// The new secret at the next generation, its update entry in the same transaction; the
    /// item's label, kind and access control stay as they are.
    /// The expiry is the new secret's (`rotate --expires`), none if not given: the old one
    /// described the secret being replaced.
    private func commit(_ item: StoredItem, _ secret: SecureBytes, expires: Int64?, _ request: Request, method: AuthMethod,
                        appPassword: AppPasswordKey?) -> Response {
        // No reserve check here: once COMMAND ran, its new token must be stored (the reserve is
        // there for the broker's own writes; this replaces an existing item in place).
        let newItem = NewItem(service: item.service, account: item.account, label: item.label, kind: item.kind,
                              access: item.access, biometryState: item.biometryState, expires: expires)
        let audit = event(request, .update, item: item, decision: .granted, method: method, outcome: .ok).record()
        let result = broker.transact(audit) { (store) throws(StoreError) -> StoredItem in
            let stored = try store.replace(item, with: newItem, secret: secret, appPassword: appPassword, audit: audit)
            try store.clearRotationLease(item.id)
            return stored
        }.mapError { Denial($0.outcome) }
        switch result {
        case .success(let stored):
            var r = Response(.ok)
            r.generation = stored.generation
            r.expires = stored.expires
            return r
        case .failure(let d) where d.outcome == .auditUnavailable: return Response(.auditUnavailable)
        case .failure(let d): return deny(request, .update, item: item, d)
        }
    }

    /// `put --update`: with `--if-generation`, *conflict* unless the item is still there;
    /// without it, a rotation in progress is waited for (up to the longest lease) and the item
    /// read again, so the put replaces what the rotation wrote, not what it started from.
    func settledForUpdate(_ request: Request, _ ref: ItemReference, _ existing: StoredItem) -> Result<StoredItem?, Denial> {
        if let g = request.ifGeneration {
            return existing.generation == g ? .success(existing) : .failure(Denial(.conflict, "the item is at generation \(existing.generation)"))
        }
        honourRecordedLease(existing.id)
        guard broker.leases.isHeld(existing.id) else { return .success(existing) }
        let deadline = MonotonicClock.milliseconds() + Int64(Limits.maxRotationSeconds) * 1000
        guard broker.leases.waitUntilFree(existing.id, deadline: deadline, clientFD: fd) else {
            return .failure(Denial(.conflict, "a rotation of this item did not finish"))
        }
        return lookup(ref)
    }
}
