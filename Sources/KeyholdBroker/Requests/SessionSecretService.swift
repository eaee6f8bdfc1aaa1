import Glibc
import KeyholdAuth
import KeyholdCore
import KeyholdVault
import KeyholdProtocol

/// What the broker makes of a request relayed by the Secret Service agent. The agent is a
/// same-user process: the pid it names as the D-Bus sender is a *claim*. The broker reads that
/// process's executable itself and records it, marked as claimed, in the audit entry and the
/// announcement; it never treats it as an identity.
extension Session {
    enum ClaimCheck {
        case none
        case claimed(Request)
        /// The request to audit (its reason says why), under the operation it asked for.
        case refused(Request, AuditEvent.Operation, Denial)
    }

    /// The request with the claimed requester written into its reason (audit and announce).
    /// Refused, for every operation, when the claimed process runs as another user, is gone
    /// (the connection that sent it outlived it: a fork after connecting, or a call sent just
    /// before leaving), or cannot be confirmed (its executable unreadable: a zombie), and when
    /// the agent says it could not read the sender's credentials at all. A claim is what lets
    /// the agent speak for a client; one the broker cannot check carries nothing out.
    func checkClaim(_ request: Request) -> ClaimCheck {
        guard let pid = request.claimedPID else { return .none }
        var st = Glibc.stat()
        let exe: String
        if pid == Request.unreadableClaimedPID {
            return refuseClaim(request, "refused: the Secret Service agent could not read the sender's credentials")
        } else if lstat("/proc/\(pid)", &st) != 0 {
            return refuseClaim(request, "refused: claimed requester (pid \(pid)) via the Secret Service is gone")
        } else if st.st_uid != caller.uid {
            // /proc/PID is owned by the process's effective uid.
            return refuseClaim(request, "refused: claimed requester (pid \(pid)) via the Secret Service runs as uid \(st.st_uid), not as the caller")
        } else if let read = CallerFacts.read(pid: pid)?.executable {
            exe = read
        } else {
            return refuseClaim(request, "refused: claimed requester (pid \(pid)) via the Secret Service cannot be confirmed")
        }
        var r = request
        let claim = "claimed requester \(exe) (pid \(pid)) via the Secret Service"
        r.reason = Self.joined(claim, request.reason)
        return .claimed(r)
    }

    /// Audited under the operation asked for, with why as the reason (names only, so an owner
    /// reading the audit sees which request was refused and why), and what the agent said it
    /// was for.
    private func refuseClaim(_ request: Request, _ why: String) -> ClaimCheck {
        var r = request
        r.reason = Self.joined(why, request.reason)
        return .refused(r, Self.auditOperation(request), Denial(.notAuthorized, "the claimed requester is not a confirmed process of this user"))
    }

    private static func joined(_ head: String, _ tail: String?) -> String {
        guard let tail, !tail.isEmpty else { return head }
        return String(decoding: Array("\(head): \(tail)".utf8.prefix(Limits.maxTextBytes)), as: UTF8.self)
    }

    /// The audit operation a request is recorded under when it is refused before dispatch.
    static func auditOperation(_ r: Request) -> AuditEvent.Operation {
        switch r.operation {
        case .put: r.update ? .update : .put
        case .get, .rotate: .get
        case .delete: .delete
        case .list: .list
        case .state: .state
        case .lock: .lock
        case .biometry: .biometry
        case .status: .status
        case .audit: r.withRows ? .auditExport : .auditRead
        case .auditVerify, .auditVerifyExport: .auditVerify
        case .auditPrune: .auditPrune
        case .search: .search
        case .backup: .backup
        }
    }

    /// An item restricted to executables is never released through the agent: the program
    /// behind it is only claimed, and any same-user process can claim any program.
    func refusedThroughAgent(_ item: StoredItem, _ request: Request) -> Denial? {
        guard request.claimedPID != nil, !item.access.allowedExecutables.isEmpty else { return nil }
        return Denial(.notAuthorized, "an item restricted with --allow-exe is not released through the Secret Service")
    }
}

/// The item and claimed requester a reuse window opened through the Secret Service agent
/// covers: an unlock the person approved in one client's prompt lets that client (its process,
/// by pid and start time) read the items the prompt named, for their reuse window, and no
/// other client or item. The agent relays every client's requests from one process in one
/// login session; keyed by that process alone, one approval would cover them all.
struct ClaimedGrant: Hashable, Sendable {
    let pid: Int32
    let startTime: UInt64
    let itemID: ItemID

    /// nil for a request without a claim, or whose claimed process cannot be read (then no
    /// window applies: ReleaseGate refuses).
    init?(_ request: Request, _ item: StoredItem) {
        guard let pid = request.claimedPID, let facts = CallerFacts.read(pid: pid), facts.startTime > 0 else { return nil }
        self.pid = pid
        startTime = facts.startTime
        itemID = item.id
    }
}
