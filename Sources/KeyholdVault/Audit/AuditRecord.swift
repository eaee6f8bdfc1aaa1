import KeyholdCore

/// What a request did, by a stable name (stored and shown; never renamed).
public enum AuditOperation: String, Sendable, CaseIterable {
    case put, update, get, delete, list, state, lock, biometry
    /// A search of the caller's items by attributes (audited like `list`: one entry, no names).
    case search
    case auditRead = "audit-read"
    case auditVerify = "audit-verify"
    case auditExport = "audit-export"
    case auditPrune = "audit-prune"
    /// A request the broker could not parse or did not know.
    case invalid
    /// Requests of one uid refused without an entry each (over its audit budget or its
    /// connection cap), counted in one entry: `reason` holds `count=N`.
    case refusedBurst = "refused-burst"
    /// The broker started with a non-default key protector (the reason names it).
    case brokerStart = "broker-start"
    /// `keyholdd --migrate-key-protector` converted the vault key (the reason names both).
    case keyProtectorMigrate = "key-protector-migrate"
    /// `keyhold status`: how the vault is protected.
    case status
    /// `keyholdd --accept-rollback`: an administrator chose to serve a vault behind its anchor.
    case acceptRollback = "accept-rollback"
    /// `keyholdd --create-recovery-key`: the vault key wrapped under a new recovery key (the
    /// reason names its identity, and whether it replaced one).
    case recoveryKeyCreate = "recovery-key-create"
    /// `keyhold backup`: a snapshot of the vault written (the reason names the file).
    case backup
    /// `keyholdd --restore`: this vault was restored from a backup (the reason names it).
    case restore
}

/// How the broker decided.
public enum AuditDecision: String, Sendable, CaseIterable {
    case granted, denied, error
}

/// How the caller was authenticated: a set of factors with a stable text such as
/// `password+app-password` (factors in a fixed order), or `none`.
public struct AuthMethod: Sendable, Equatable, CustomStringConvertible {
    public enum Factor: String, Sendable, CaseIterable {
        // Order here is the order in the text.
        case fingerprint, password, reuse
        case appPassword = "app-password"
    }

    public private(set) var factors: [Factor]

    public static let none = AuthMethod(factors: [])
    public static let fingerprint = AuthMethod(factors: [.fingerprint])
    public static let password = AuthMethod(factors: [.password])
    public static let reuse = AuthMethod(factors: [.reuse])
    public static let appPassword = AuthMethod(factors: [.appPassword])

    public init(factors: [Factor]) {
        self.factors = Factor.allCases.filter { factors.contains($0) }
    }

    /// Parses the stored text; nil for anything else.
    public init?(text: String) {
        if text == "none" { self = .none; return }
        var fs: [Factor] = []
        for part in text.split(separator: "+", omittingEmptySubsequences: false) {
            guard let f = Factor(rawValue: String(part)), !fs.contains(f) else { return nil }
            fs.append(f)
        }
        self.init(factors: fs)
        guard description == text else { return nil }
    }

    public func adding(_ factor: Factor) -> AuthMethod { AuthMethod(factors: factors + [factor]) }

    public var description: String { factors.isEmpty ? "none" : factors.map(\.rawValue).joined(separator: "+") }
}

/// One audit entry as the broker hands it to the store. Never holds a secret.
public struct AuditRecord: Sendable, Equatable {
    /// Microseconds since the epoch (UTC).
    public var time: Int64
    public var callerUID: UInt32
    public var callerPID: Int32
    /// `/proc/PID/exe` of the caller, or "" when it could not be read.
    public var executable: String
    public var operation: AuditOperation
    public var itemID: ItemID?
    /// Stored sealed under the attribute key: no name is in plaintext on disk.
    public var service: String?
    public var account: String?
    public var decision: AuditDecision
    public var method: AuthMethod
    /// The caller's stated reason (sealed with the names).
    public var reason: String?
    /// `Outcome.name` of the answer.
    public var outcome: Outcome

    public init(time: Int64 = currentMicroseconds(), callerUID: UInt32, callerPID: Int32, executable: String,
                operation: AuditOperation, itemID: ItemID? = nil, service: String? = nil, account: String? = nil,
                decision: AuditDecision, method: AuthMethod = .none, reason: String? = nil, outcome: Outcome) {
        self.time = time
        self.callerUID = callerUID
        self.callerPID = callerPID
        self.executable = executable
        self.operation = operation
        self.itemID = itemID
        self.service = service
        self.account = account
        self.decision = decision
        self.method = method
        self.reason = reason
        self.outcome = outcome
    }
}

/// A stored audit entry, decrypted for display.
public struct AuditEntryView: Sendable, Equatable {
    public let seq: Int64
    /// What it says. Stored names as text (an unknown name from a newer broker is shown, not
    /// dropped); service, account and reason nil when the entry has none or they did not open.
    public let readable: AuditReadableFields
    /// The entry's chain MAC, so an export can be verified on its own.
    public let mac: [UInt8]
    /// False when the sealed names failed to open (the row was altered); `audit verify` says where.
    public let detailsIntact: Bool
    /// For a non-root reader: the entry's number among that user's own entries (1, 2, 3, …),
    /// shown instead of `seq`, whose gaps would reveal when others use the vault.
    public var ownSeq: Int64? = nil
}

/// The result of checking the whole audit chain.
public enum AuditVerification: Sendable, Equatable {
    /// Every entry from the checkpoint (or the first) to the head verified.
    case intact(count: Int64)
    /// The first entry that is wrong, and how.
    case broken(seq: Int64, problem: AuditProblem)
}

public enum AuditProblem: String, Sendable, Equatable, CaseIterable {
    /// The entry's fields or MAC were edited.
    case altered
    /// The entry with this seq is missing (deleted from the middle).
    case removed
    /// A forged entry sits at this seq.
    case inserted
    /// A genuine entry sits at the wrong place.
    case reordered
    /// Entries from this seq on were deleted (or the head no longer vouches for the tail).
    case truncatedTail = "truncated-tail"
}
