import Glibc
import KeyholdCore
import KeyholdProtocol

@_exported import struct KeyholdCore.AccessControl
@_exported import struct KeyholdCore.Policy
@_exported import enum KeyholdCore.ItemKind
@_exported import class KeyholdCore.SecureBytes
@_exported import struct KeyholdProtocol.ItemInfo
@_exported import struct KeyholdProtocol.AuditEntryInfo
@_exported import struct KeyholdCore.AuditExportHeader
@_exported import struct KeyholdProtocol.Prompt
@_exported import struct KeyholdProtocol.Notice

/// What `state` reports about an item, without prompting (like `LAContext` evaluation state).
public enum ItemState: String, Sendable {
    case available
    case requiresAuthentication = "requires-authentication"
    case invalidated
    /// Past the expiry it was stored with; still released (the caller decides).
    case expired
    case notFound = "not-found"
}

/// `state` with the item's generation and expiry (nil generation: no such item).
public struct ItemStatus: Sendable {
    public let state: ItemState
    public let lockoutSecondsLeft: UInt64?
    public let generation: UInt64?
    public let expires: Int64?
}

/// The enrolled fingerprints the broker sees for the caller.
public struct BiometryInfo: Sendable {
    public let reader: String?
    public let enrolledFingers: [String]
    /// Items stored under `biometry-current-set` that a change of the enrolled set would invalidate.
    public let itemsBoundToCurrentSet: UInt64
}

public struct AuditVerificationReport: Sendable {
    public let verified: Bool
    public let count: UInt64
    public let firstBadSeq: UInt64?
    public let problem: String?
}

/// A caller's view of Keyhold: one obvious call per intent, in the manner of Valet and
/// KeychainAccess. Every call is one request to the broker over its Unix socket; the broker
/// decides, prompts through `interaction`, audits, and only then releases.
public struct Vault: Sendable {
    public static let defaultSocketPath = "/run/keyhold/keyhold.sock"

    public let socketPath: String

    /// The socket from `$KEYHOLD_SOCKET`, else the system default.
    public init(socketPath: String? = nil) {
        if let socketPath {
            self.socketPath = socketPath
        } else if let env = getenv("KEYHOLD_SOCKET"), env.pointee != 0 {
            self.socketPath = String(cString: env)
        } else {
            self.socketPath = Vault.defaultSocketPath
        }
    }

    /// Stores a new item. Throws `.duplicateItem` if one exists for this service and account.
    /// An `appPassword` is required exactly when the policy has `+app-password`.
    public func add(_ secret: SecureBytes, service: String, account: String, label: String = "",
                    kind: ItemKind = .generic, access: AccessControl = AccessControl(),
                    appPassword: SecureBytes? = nil, expires: Int64? = nil, interaction: Interaction? = nil) throws(KeyholdError) {
        try store(secret, service: service, account: account, label: label, kind: kind, access: access,
                  appPassword: appPassword, update: false, expires: expires, interaction: interaction)
    }

    /// Replaces an existing item's secret, label and access control, after satisfying its
    /// current policy. Throws `.notFound` if there is none.
    public func update(_ secret: SecureBytes, service: String, account: String, label: String = "",
                       kind: ItemKind = .generic, access: AccessControl = AccessControl(),
                       appPassword: SecureBytes? = nil, reason: String? = nil, ifGeneration: UInt64? = nil,
                       expires: Int64? = nil, interaction: Interaction? = nil) throws(KeyholdError) {
        try store(secret, service: service, account: account, label: label, kind: kind, access: access,
                  appPassword: appPassword, update: true, reason: reason, ifGeneration: ifGeneration, expires: expires,
                  interaction: interaction)
    }

    /// The item's secret, after its policy is satisfied. Without `interaction`, a policy that
    /// needs a prompt fails with `.interactionNotAllowed` at once (like `.notInteractive`).
    public func secret(service: String, account: String, reason: String? = nil,
                       interaction: Interaction? = nil) throws(KeyholdError) -> SecureBytes {
        var r = Request(.get, item: ItemReference(service: service, account: account))
        r.reason = reason
        r.allowInteraction = interaction != nil
        let response = try perform(r, interaction: interaction)
        guard let secret = response.secret else { throw .other("the broker released no secret") }
        return secret
    }

    /// Removes an item, after satisfying its policy when it needs authentication or names
    /// allowed executables (unlike `SecItemDelete`: removing a gated item and storing another
    /// under its name would replace it without its policy). An item that no longer opens
    /// (integrity) or is invalidated is removed after its owner's password. Without
    /// `interaction` such removals fail with `.interactionNotAllowed`. Throws `.notFound` if
    /// there is none.
    public func delete(service: String, account: String, reason: String? = nil,
                       interaction: Interaction? = nil) throws(KeyholdError) {
        var r = Request(.delete, item: ItemReference(service: service, account: account))
        r.reason = reason
        r.allowInteraction = interaction != nil
        _ = try perform(r, interaction: interaction)
    }

    /// Metadata of the caller's items. Never a secret.
    public func items() throws(KeyholdError) -> [ItemInfo] {
        var all: [ItemInfo] = []
        _ = try perform(Request(.list), interaction: nil, onItems: { all.append(contentsOf: $0) })
        return all
    }

    /// Whether reading the item would need authentication, without prompting.
    public func state(service: String, account: String) throws(KeyholdError) -> ItemState {
        try status(service: service, account: account).state
    }

    /// The item's state and, when the caller is locked out, the seconds left — one request.
    public func status(service: String, account: String) throws(KeyholdError) -> (state: ItemState, lockoutSecondsLeft: UInt64?) {
        let s = try itemStatus(service: service, account: account)
        return (s.state, s.lockoutSecondsLeft)
    }

    /// The item's state, generation and expiry, and the caller's lockout — one request.
    public func itemStatus(service: String, account: String) throws(KeyholdError) -> ItemStatus {
        let response = try perform(Request(.state, item: ItemReference(service: service, account: account)),
                                   interaction: nil, acceptNotFound: true)
        guard let word = response.state, let state = ItemState(rawValue: word) else {
            throw .other("the broker sent an unknown item state")
        }
        return ItemStatus(state: state, lockoutSecondsLeft: response.secondsLeft, generation: response.generation,
                          expires: response.expires)
    }

    /// How the broker protects the vault: `key-protector=KIND rollback-detection=...`.
    public func protectionStatus() throws(KeyholdError) -> String {
        try perform(Request(.status), interaction: nil).detail ?? ""
    }

    /// Ends every authentication reuse window of the caller at once.
    public func lock() throws(KeyholdError) {
        _ = try perform(Request(.lock), interaction: nil)
    }

    /// The caller's reader and enrolled fingers as the broker sees them.
    public func biometry() throws(KeyholdError) -> BiometryInfo {
        let r = try perform(Request(.biometry), interaction: nil)
        return BiometryInfo(reader: r.reader, enrolledFingers: r.fingers, itemsBoundToCurrentSet: r.count ?? 0)
    }

    /// Audit entries visible to the caller (their own; root sees all). With `follow`, keeps
    /// delivering new entries until `handler` returns false.
    public func auditEntries(since: Int64? = nil, until: Int64? = nil, item: (service: String, account: String)? = nil,
                             follow: Bool = false, handler: ([AuditEntryInfo]) -> Bool) throws(KeyholdError) {
        var r = Request(.audit, item: item.map { ItemReference(service: $0.service, account: $0.account) })
        r.since = since
        r.until = until
        r.follow = follow
        _ = try perform(r, interaction: nil, onAudit: handler)
    }

    /// Verifies the whole audit chain in the broker.
    public func verifyAudit() throws(KeyholdError) -> AuditVerificationReport {
        let conn = try BrokerConnection(socketPath: socketPath)
        defer { conn.close() }
        let r = try conn.perform(Request(.auditVerify), interaction: nil)
        switch r.outcome {
        case .ok: return AuditVerificationReport(verified: true, count: r.count ?? 0, firstBadSeq: nil, problem: nil)
        case .integrityFailure:
            return AuditVerificationReport(verified: false, count: r.count ?? 0, firstBadSeq: r.firstBadSeq, problem: r.detail)
        default: throw KeyholdError(r)
        }
    }

    /// Exports the audit chain (root only): every entry from its start (genesis, or the
    /// checkpoint of the last prune) through the newest written at or before `until` (µs since
    /// the epoch), each with the row bytes and MACs that let the export be verified on its own.
    /// `header` is called once, before any rows; `rows` receives them in seq order (returning
    /// false stops the export, which then throws). Returns the number of entries exported.
    public func exportAudit(until: Int64, header: (AuditExportHeader) -> Void,
                            rows: ([AuditEntryInfo]) -> Bool) throws(KeyholdError) -> UInt64 {
        var r = Request(.audit)
        r.until = until
        r.withRows = true
        let conn = try BrokerConnection(socketPath: socketPath)
        defer { conn.close() }
        var sawHeader = false
        var complete = true
        var stopped = false
        let response = try conn.perform(r, interaction: nil, onAudit: { entries in
            // An export line without its row bytes or before the header could not be verified later.
            guard sawHeader, entries.allSatisfy({ $0.row != nil }) else { complete = false; return false }
            if !rows(entries) { stopped = true; return false }
            return true
        }, onExportHeader: { h in
            sawHeader = true
            header(h)
        })
        guard complete, sawHeader || response.outcome != .ok else { throw .other("the broker sent an incomplete export") }
        if stopped { throw .other("the export was stopped before its end") }
        guard response.outcome == .ok else { throw KeyholdError(response) }
        return response.count ?? 0
    }

    /// Has the broker check an exported audit file with its key: `header` (the file's first
    /// line), then the rows that `nextRows` returns, in file order, until it returns nil. The
    /// answer is the number of entries verified, or the first bad seq (0: the header) and why.
    public func verifyAuditExport(header: AuditExportHeader,
                                  nextRows: () throws(KeyholdError) -> [AuditEntryInfo]?) throws(KeyholdError) -> AuditVerificationReport {
        var r = Request(.auditVerifyExport)
        r.exportHeader = header
        let conn = try BrokerConnection(socketPath: socketPath)
        defer { conn.close() }
        do throws(KeyholdError) {
            try conn.send(.request(r))
            while let rows = try nextRows() {
                for batch in ClientMessage.auditRowBatches(rows) { try conn.send(batch) }
            }
            try conn.send(.auditRowsEnd)
        } catch .brokerUnavailable {
            // The broker answered early (and closed): its answer may already be waiting.
        }
        while true {
            guard case .response(let response) = try conn.receive() else { continue }
            switch response.outcome {
            case .ok: return AuditVerificationReport(verified: true, count: response.count ?? 0, firstBadSeq: nil, problem: nil)
            case .integrityFailure:
                return AuditVerificationReport(verified: false, count: 0, firstBadSeq: response.firstBadSeq, problem: response.detail)
            default: throw KeyholdError(response)
            }
        }
    }

    /// Removes audit entries up to `until` (µs since the epoch), leaving a checkpoint. Root only.
    public func pruneAudit(until: Int64) throws(KeyholdError) -> UInt64 {
        var r = Request(.auditPrune)
        r.until = until
        return try perform(r, interaction: nil).count ?? 0
    }

    // MARK: -

    private func store(_ secret: SecureBytes, service: String, account: String, label: String, kind: ItemKind,
                       access: AccessControl, appPassword: SecureBytes?, update: Bool, reason: String? = nil,
                       ifGeneration: UInt64? = nil, expires: Int64? = nil, interaction: Interaction?) throws(KeyholdError) {
        guard secret.count <= Limits.maxSecretBytes else {
            throw .invalidRequest("secret is \(secret.count) bytes; the limit is \(Limits.maxSecretBytes)")
        }
        guard access.policy.requiresAppPassword == (appPassword != nil) else {
            throw .invalidRequest(access.policy.requiresAppPassword
                ? "policy needs an application password" : "an application password needs a +app-password policy")
        }
        var r = Request(.put, item: ItemReference(service: service, account: account))
        r.secret = secret
        r.appPassword = appPassword
        r.label = label
        r.kind = kind
        r.policy = access.policy.description
        r.allowedExecutables = access.allowedExecutables
        r.reuseSeconds = access.reuseSeconds
        r.update = update
        r.ifGeneration = ifGeneration
        r.expires = expires
        r.reason = reason
        r.allowInteraction = interaction != nil
        _ = try perform(r, interaction: interaction)
    }

    func perform(_ request: Request, interaction: Interaction?, acceptNotFound: Bool = false,
                         onItems: ([ItemInfo]) -> Void = { _ in },
                         onAudit: ([AuditEntryInfo]) -> Bool = { _ in true }) throws(KeyholdError) -> Response {
        try checkItemNames(request)
        // One connection per request: the broker serves one and closes it.
        let conn = try BrokerConnection(socketPath: socketPath)
        defer { conn.close() }
        let response = try conn.perform(request, interaction: interaction, onItems: onItems, onAudit: onAudit)
        if response.outcome == .ok || (acceptNotFound && response.state != nil) { return response }
        throw KeyholdError(response)
    }

    func checkItemNames(_ request: Request) throws(KeyholdError) {
        if let item = request.item {
            guard !item.service.isEmpty, !item.account.isEmpty else { throw .invalidRequest("service and account must not be empty") }
            guard item.service.utf8.count <= Limits.maxTextBytes, item.account.utf8.count <= Limits.maxTextBytes else {
                throw .invalidRequest("service or account longer than \(Limits.maxTextBytes) bytes")
            }
        }
    }
}
