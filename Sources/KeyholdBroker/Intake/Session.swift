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
    /// The request table's row being served (`RequestKind`): whether its handler may prompt.
    var kind: RequestKind? = nil
    /// The connection's slot, given back as its answer is written (`SlotHold`).
    var hold: SlotHold? = nil

    /// How long a client may take: its whole request (from accept), an answer to a prompt
    /// (a person typing), and any other frame after the first byte may be idle before it.
    enum Deadlines {
        static let requestMilliseconds = 5_000
        static let answerMilliseconds = 120_000
        static let idleMilliseconds = 5_000
        static let frameMilliseconds = 10_000
    }

    /// Serves one accepted connection: one request, read within its deadline by the one reader
    /// of peer bytes (`TimedFrameReader`), its sender identified from the frame's credentials,
    /// answered; the caller then closes the connection.
    static func serve(fd: Int32, peer: Peer, broker: Broker, hold: SlotHold? = nil) {
        var reader = TimedFrameReader(fd: fd)
        let ms = Deadlines.requestMilliseconds
        do throws(FrameError) {
            guard let payload = try reader.read(idleMilliseconds: ms, frameMilliseconds: ms) else { return }
            let caller = Caller.identify(socket: fd, peer: peer, senders: reader.senders)
            Session(fd: fd, caller: caller, broker: broker, hold: hold).run(payload, senderUIDs: reader.senders.map(\.uid))
        } catch {
            // Refused, audited under whoever sent the bytes that were read, if any did; else the peer.
            var caller = reader.senders.isEmpty ? Caller.identify(socket: fd, peer: peer)
                : Caller.identify(socket: fd, peer: peer, senders: reader.senders)
            caller.identityProblem = "the request could not be read"
            Session(fd: fd, caller: caller, broker: broker, hold: hold).rejectMalformed(error)
        }
    }

    /// Answers one request: refused when the vault was seen rolled back, when the caller is
    /// over its audit budget, or when its bytes came from another user than the one that
    /// connected; else dispatched through the request table (`RequestKind`).
    func run(_ payload: SecureBytes, senderUIDs: [UInt32]) {
        let message: ClientMessage
        do throws(FrameError) {
            message = try ClientMessage.decode(payload)
        } catch {
            rejectMalformed(error)
            return
        }
        payload.wipe()
        guard case .request(let request) = message else { return rejectMalformed(.unexpectedMessage) }
        defer {
            request.secret?.wipe()
            request.appPassword?.wipe()
        }
        // A vault seen rolled back while serving: nothing more (RollbackWatch.swift).
        if let refused = broker.rollbackAnswer() {
            send(.response(refused))
            return
        }
        // Over this uid's audit budget: not carried out, counted for its refused-burst entry.
        guard broker.budget.admit(uid: caller.uid) else {
            send(.response(Response(.busy, detail: "too many requests from this user; try again shortly")))
            return
        }
        let response: Response
        if let foreign = senderUIDs.first(where: { $0 != caller.uid }) {
            // A connection handed to another user's process: neither may act through it. The
            // entry (and the audit budget) is the sender's.
            response = Session(fd: fd, caller: caller.sentBy(uid: foreign), broker: broker)
                .deny(request, .invalid, item: nil, Denial(.notAuthorized, "the request was sent by another user than the one that connected"))
        } else {
            response = broker.rollbackAnswer(replacing: dispatch(request))!
        }
        send(.response(response))
        response.secret?.wipe()
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
        if case .response = message { hold?.giveBack() }  // the last frame of a connection
        do throws(FrameError) {
            try Frame.write(message.encode(), to: fd)
            return true
        } catch {
            return false
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
        broker.gate.authorize(item, caller: caller, request: request, via: conversation, store: broker)
    }

    /// The gate's conversation over this socket; one that refuses to prompt unless the request
    /// table says this request may (`RequestKind.mayPrompt`).
    var conversation: SocketConversation {
        SocketConversation(fd: fd, mayPrompt: kind?.mayPrompt ?? false)
    }
}
