import KeyholdVault
import KeyholdProtocol

/// The broker's requests, one row each, as OpenSSH's monitor lists its requests in
/// `mon_dispatch_proto20[]`: what each may do is read here, and `Session.dispatch` enforces the
/// columns before and after the handler runs.
///
/// - `namesItem`: the request must name an item; without one it is refused *usage*.
/// - `rootOnly`: only uid 0 may make it (the text is the refusal's reason); anyone else is
///   refused, audited, before its handler runs.
/// - `mayPrompt`: its handler may hold a conversation with the caller (the gate's prompts);
///   every other handler's gate gets a conversation that prompts no one (`SocketConversation`).
/// - `releases`: its handler may answer with a secret, and only through `Session.release`
///   (opened under the writer, in the group commit that holds its audit entry). An answer of
///   any other row that carries a secret is never sent.
/// - `audit`: the operation its audit entries carry (a `put` that replaces an item: `update`).
struct RequestKind: Sendable {
    let operation: Operation
    /// `audit` with `withRows` (an export) is a row of its own.
    var exportsRows = false
    let namesItem: Bool
    let rootOnly: String?
    let mayPrompt: Bool
    let releases: Bool
    let audit: AuditEvent.Operation
    let handler: @Sendable (Session, Request) -> Response

    static let table: [RequestKind] = [
        //    operation                 namesItem    rootOnly     mayPrompt    releases     audit
        RequestKind(operation: .get, namesItem: true, rootOnly: nil, mayPrompt: true, releases: true, audit: .get) { $0.get($1) },
        RequestKind(operation: .rotate, namesItem: true, rootOnly: nil, mayPrompt: true, releases: true, audit: .get) { $0.rotate($1) },
        RequestKind(operation: .put, namesItem: true, rootOnly: nil, mayPrompt: true, releases: false, audit: .put) { $0.put($1) },
        RequestKind(operation: .delete, namesItem: true, rootOnly: nil, mayPrompt: true, releases: false, audit: .delete) { $0.delete($1) },
        RequestKind(operation: .state, namesItem: true, rootOnly: nil, mayPrompt: false, releases: false, audit: .state) { $0.state($1) },
        RequestKind(operation: .list, namesItem: false, rootOnly: nil, mayPrompt: false, releases: false, audit: .list) { $0.list($1) },
        RequestKind(operation: .search, namesItem: false, rootOnly: nil, mayPrompt: false, releases: false, audit: .search) { $0.search($1) },
        RequestKind(operation: .status, namesItem: false, rootOnly: nil, mayPrompt: false, releases: false, audit: .status) { $0.status($1) },
        RequestKind(operation: .lock, namesItem: false, rootOnly: nil, mayPrompt: false, releases: false, audit: .lock) { $0.lock($1) },
        RequestKind(operation: .biometry, namesItem: false, rootOnly: nil, mayPrompt: false, releases: false, audit: .biometry) { $0.biometry($1) },
        RequestKind(operation: .audit, namesItem: false, rootOnly: nil, mayPrompt: false, releases: false, audit: .auditRead) { $0.auditQuery($1) },
        RequestKind(operation: .audit, exportsRows: true, namesItem: false, rootOnly: "only root may export the audit log", mayPrompt: false, releases: false,
                    audit: .auditExport) { $0.auditExport($1) },
        RequestKind(operation: .auditVerify, namesItem: false, rootOnly: nil, mayPrompt: false, releases: false,
                    audit: .auditVerify) { $0.auditVerify($1) },
        RequestKind(operation: .auditVerifyExport, namesItem: false, rootOnly: nil, mayPrompt: false, releases: false,
                    audit: .auditVerify) { $0.auditVerifyExport($1) },
        RequestKind(operation: .auditPrune, namesItem: false, rootOnly: "only root may prune the audit log", mayPrompt: false, releases: false,
                    audit: .auditPrune) { $0.auditPrune($1) },
        RequestKind(operation: .backup, namesItem: false, rootOnly: "only root may back up the vault", mayPrompt: false, releases: false,
                    audit: .backup) { $0.backup($1) },
    ]

    /// The row that serves `request` (every request decodes to exactly one).
    static func of(_ request: Request) -> RequestKind {
        table.first { $0.operation == request.operation && $0.exportsRows == (request.operation == .audit && request.withRows) }!
    }

    /// The operation `request`'s entries carry.
    func auditOperation(_ request: Request) -> AuditEvent.Operation {
        operation == .put && request.update ? .update : audit
    }
}

extension Session {
    /// Serves `request` by its row of the request table, enforcing the row's columns.
    func dispatch(_ request: Request) -> Response {
        let kind = RequestKind.of(request)
        var session = self
        session.kind = kind
        return session.serve(request, as: kind)
    }

    private func serve(_ request: Request, as kind: RequestKind) -> Response {
        let op = kind.auditOperation(request)
        if kind.namesItem, request.item == nil { return deny(request, op, item: nil, Denial(.usage, "the request names no item")) }
        if let rootOnly = kind.rootOnly, caller.uid != 0 { return deny(request, op, item: nil, Denial(.notAuthorized, rootOnly)) }
        // Item writes stop short of the free-space reserve; audit entries may still use it.
        if request.operation == .put {
            if broker.reserve.isLow { return deny(request, op, item: nil, .belowReserve) }
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
        let response = kind.handler(self, request)
        guard response.secret == nil || kind.releases else {
            // Never reached by the handlers as written; a secret from any other row is not sent.
            response.secret?.wipe()
            broker.log("a \(op.rawValue) answer carried a secret; not sent")
            return Response(.otherError)
        }
        return response
    }
}
