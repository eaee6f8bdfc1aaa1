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
    /// Refused when the claimed process runs as another user.
    func checkClaim(_ request: Request) -> ClaimCheck {
        guard let pid = request.claimedPID else { return .none }
        var st = Glibc.stat()
        let exe: String
        if lstat("/proc/\(pid)", &st) == 0 {
            // /proc/PID is owned by the process's effective uid.
            guard st.st_uid == caller.uid else {
                // Audited under the operation asked for, with the pid and its uid as the reason:
                // names only, so an owner reading the audit sees which request was refused and why.
                var r = request
                r.reason = "refused: claimed requester (pid \(pid)) via the Secret Service runs as uid \(st.st_uid), not as the caller"
                return .refused(r, Self.auditOperation(request), Denial(.notAuthorized, "the claimed requester is not this user's process"))
            }
            exe = CallerFacts.read(pid: pid)?.executable ?? "?"
        } else {
            exe = "?"  // gone already: the claim is recorded as unreadable
        }
        var r = request
        let claim = "claimed requester \(exe) (pid \(pid)) via the Secret Service"
        if let reason = request.reason, !reason.isEmpty {
            r.reason = String(decoding: Array("\(claim): \(reason)".utf8.prefix(Limits.maxTextBytes)), as: UTF8.self)
        } else {
            r.reason = claim
        }
        return .claimed(r)
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
