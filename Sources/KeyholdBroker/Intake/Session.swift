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
        /// How long a kept connection may wait for its next request: it holds one of its uid's
        /// connection slots and a thread meanwhile, so briefly (a client reuses it within
        /// 0.5 s: KeptConnection.swift); that request then has `requestMilliseconds`.
        static let keepAliveMilliseconds = 1_000
    }

    /// Serves one accepted connection: reads each request within its deadline, identifies the
    /// process that sent it (not only the one that connected, and anew for every request: a
    /// kept connection may have changed hands or executables since), and answers.
    /// `slots`: where a kept connection waits for its next request, so that its uid, at its
    /// cap, can have it ended (ConnectionSlots.makeRoom).
    /// `loop`: where the connection waits after its first request (EventLoop.swift); true when
    /// it took the connection, which this thread then leaves open.
    static func serve(fd: Int32, peer: Peer, broker: Broker, slots: ConnectionSlots? = nil, loop: EventLoop? = nil) -> Bool {
        var reader = TimedFrameReader(fd: fd)
        var first = true
        var kept: KeptWait?
        defer { if let kept { slots?.forget(kept) } }
        while true {
            if !first, kept == nil { kept = slots?.keep(fd: fd, uid: peer.uid) }
            let waitingSince = kept?.startWaiting()
            let idle = first ? Deadlines.requestMilliseconds : Deadlines.keepAliveMilliseconds
            let whole = first ? Deadlines.requestMilliseconds : Deadlines.keepAliveMilliseconds + Deadlines.requestMilliseconds
            let read = Result { () throws(FrameError) in
                try reader.read(idleMilliseconds: idle, frameMilliseconds: whole, idleEndsStream: !first)
            }
            if let kept, let waitingSince, kept.stopWaiting(waitingSince) {
                if case .success(let p?) = read { answerBusyAfterWaitEnded(p, fd: fd) }
                return false
            }
            guard answer(read, readBy: reader, fd: fd, peer: peer, broker: broker, kept: !first) else { return false }
            first = false
            // From here on it waits for its next request in the loop, not on this thread.
            if kept == nil, let loop, loop.adopt(fd: fd, peer: peer) { return true }
        }
    }

    /// One request on a kept connection whose bytes have begun to come, for the event loop
    /// (a request not yet wholly sent, which a worker does not wait for): read within the
    /// request's deadline, identify its sender, answer. True when the connection may carry
    /// another.
    static func serveNext(fd: Int32, peer: Peer, broker: Broker) -> Bool {
        var reader = TimedFrameReader(fd: fd)
        let read = Result { () throws(FrameError) in
            try reader.read(idleMilliseconds: Deadlines.requestMilliseconds, frameMilliseconds: Deadlines.requestMilliseconds,
                            idleEndsStream: true)
        }
        return answer(read, readBy: reader, fd: fd, peer: peer, broker: broker, kept: true)
    }

    /// One read request answered: refused (and audited) when it could not be read; else its
    /// sender identified from the frame's credentials and the request run. True when the
    /// connection may carry another; false also when the client left (nothing was read).
    private static func answer(_ read: Result<SecureBytes?, FrameError>, readBy reader: TimedFrameReader,
                               fd: Int32, peer: Peer, broker: Broker, kept: Bool) -> Bool {
        switch read {
        case .success(nil):
            return false
        case .success(let payload?):
            let caller = Caller.identify(socket: fd, peer: peer, senders: reader.senders)
            return Session(fd: fd, caller: caller, broker: broker).run(payload, senderUIDs: reader.senders.map(\.uid), kept: kept)
        case .failure(let error):
            reject(error, readBy: reader, fd: fd, peer: peer, broker: broker)
            return false
        }
    }

    /// A kept connection whose wait for a next request was ended (ConnectionSlots.makeRoom, or
    /// the event loop's idle limit; its reading side is shut, so this does not wait): a request
    /// sent before that is answered *busy*, not decided.
    static func answerBusyIfAsked(fd: Int32) {
        var reader = TimedFrameReader(fd: fd)
        if let p = try? reader.read(idleMilliseconds: 100, frameMilliseconds: 100, idleEndsStream: true) {
            answerBusyAfterWaitEnded(p, fd: fd)
        }
    }

    /// Ended to make room: the request is answered *busy* (its client asks again on a new
    /// connection); then the connection ends.
    private static func answerBusyAfterWaitEnded(_ payload: SecureBytes, fd: Int32) {
        payload.wipe()
        let busy = BrokerMessage.response(Response(.busy, detail: "connection ended to make room; try again")).encode()
        try? Frame.write(busy, to: fd)
        busy.wipe()
    }

    /// A request that could not be read: refused, audited under whoever sent the bytes that were
    /// read, if any did; else the peer.
    static func reject(_ error: FrameError, readBy reader: TimedFrameReader, fd: Int32, peer: Peer, broker: Broker) {
        var caller = reader.senders.isEmpty ? Caller.identify(socket: fd, peer: peer)
            : Caller.identify(socket: fd, peer: peer, senders: reader.senders)
        caller.identityProblem = "the request could not be read"
        Session(fd: fd, caller: caller, broker: broker).rejectMalformed(error)
    }

    /// What a worker of the event loop may answer itself (EventLoop.next): a `get` from the
    /// connection's own user, not a Secret Service claim, of an item whose policy needs no
    /// person, no application password and no executable check, so that neither the gate nor
    /// the release waits for anything but the commit. nil leaves the request to `run` on a
    /// thread (which decodes and checks it again, all of it). Checked in `run`'s order, the
    /// audit budget last: a refusal there is the *busy* answer `run` gives, which ends the
    /// connection.
    enum WorkerRequest {
        case get(Request, ReleaseRow)
        case refused(Response)
    }

    func forWorker(_ payload: SecureBytes, senderUIDs: [UInt32]) -> WorkerRequest? {
        guard let message = try? ClientMessage.decode(payload), case .request(let request) = message else { return nil }
        let policy: Policy?
        let found: ReleaseRow?
        if request.operation == .get, request.claimedPID == nil, let ref = request.item,
           !senderUIDs.contains(where: { $0 != caller.uid }), broker.rollbackAnswer() == nil,
           case .success(let row?) = broker.releaseRows.row(owner: caller.uid, ref, read: { releaseLookup(ref) }) {
            (policy, found) = (row.item.access.policy, row)
        } else {
            (policy, found) = (nil, nil)
        }
        guard let policy, let found, policy.constraints.isEmpty, !policy.requiresAppPassword,
              found.item.access.allowedExecutables.isEmpty else {
            request.secret?.wipe()
            request.appPassword?.wipe()
            return nil
        }
        guard broker.budget.admit(uid: caller.uid) else {
            return .refused(Response(.busy, detail: "too many requests from this user; try again shortly"))
        }
        return .get(request, found)
    }

    /// Answers one request; true when the connection may carry another (`keepsConnection`, and
    /// the response was delivered). `kept`: not the connection's first request.
    func run(_ payload: SecureBytes, senderUIDs: [UInt32], kept: Bool = false) -> Bool {
        let message: ClientMessage
        do throws(FrameError) {
            message = try ClientMessage.decode(payload)
        } catch {
            rejectMalformed(error)
            return false
        }
        payload.wipe()
        guard case .request(let request) = message else {
            switch message {
            case .answer(let late) where kept:
                // A prompt's answer that came after its request was decided (its deadline
                // passed): the end of the connection, not a malformed request.
                late.wipe()
                return false
            case .cancel where kept:
                return false
            default:
                rejectMalformed(.unexpectedMessage)
                return false
            }
        }
        // A vault seen rolled back while serving: nothing more (RollbackWatch.swift).
        if let refused = broker.rollbackAnswer() {
            send(.response(refused))
            request.secret?.wipe()
            request.appPassword?.wipe()
            return false
        }
        // Over this uid's audit budget: not carried out, counted for its refused-burst entry.
        guard broker.budget.admit(uid: caller.uid) else {
            send(.response(Response(.busy, detail: "too many requests from this user; try again shortly")))
            request.secret?.wipe()
            request.appPassword?.wipe()
            return false
        }
        let response: Response
        let foreign = senderUIDs.first(where: { $0 != caller.uid })
        if let foreign {
            // A connection handed to another user's process: neither may act through it. The
            // entry (and the audit budget) is the sender's.
            response = Session(fd: fd, caller: caller.sentBy(uid: foreign), broker: broker)
                .deny(request, .invalid, item: nil, Denial(.notAuthorized, "the request was sent by another user than the one that connected"))
        } else {
            response = broker.rollbackAnswer(replacing: handle(request))!
        }
        let delivered = send(.response(response))
        response.secret?.wipe()
        request.secret?.wipe()
        request.appPassword?.wipe()
        return delivered && foreign == nil && response.outcome != .busy && request.operation.keepsConnection
    }

    /// A frame that could not be parsed gets an error frame (when the socket still works), an
    /// audit entry, and the connection is closed by the caller of `run`.
    func rejectMalformed(_ error: FrameError) {
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

    func handle(_ request: Request) -> Response {
        // Item writes stop short of the free-space reserve; audit entries may still use it.
        if request.operation == .put {
            if broker.reserve.isLow {
                return deny(request, request.update ? .update : .put, item: nil, .belowReserve)
            }
            // What an item write can add (sealed secret and texts) counts against the uid's budget too.
            let texts = [request.label, request.item?.service, request.item?.account].reduce(0) { $0 + ($1?.utf8.count ?? 0) }
            broker.budget.charge(uid: caller.uid, bytes: (request.secret?.count ?? 0) + (request.appPassword?.count ?? 0) + texts + 512)
        }
        var request = request
        switch checkClaim(request) {
        case .none: break
        case .claimed(let r): request = r
        case .refused(let r, let op, let d): return deny(r, op, item: nil, d)
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
        case .search: return search(request)
        case .backup: return caller.uid == 0 ? backup(request) : deny(request, .backup, item: nil, Denial(.notAuthorized, "only root may back up the vault"))
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
}
