import KeyholdCore

/// What a caller asks the broker to do.
public enum Operation: UInt8, Sendable, CaseIterable {
    case put = 1, get, delete, list, state, lock, biometry, audit, auditVerify, auditPrune
    /// Checks an exported audit file: the request carries its header, `auditRows` batches
    /// and an `auditRowsEnd` marker follow on the same connection.
    case auditVerifyExport
    /// How the vault is protected (key protector, rollback detection); the answer's `detail`
    /// is `key-protector=KIND rollback-detection=none|tpm-counter`.
    case status
    /// Rotation (see RotationMessages.swift): `rotationCurrent`, then the client's `rotated`.
    case rotate
    /// The caller's items whose attribute map holds every pair of `Request.searchAttributes`
    /// (all of them for an empty query); answered like `list` (`.items` batches, then the response).
    case search
    /// Root only: the broker writes a backup of the vault to the file `Request.label` names
    /// (an absolute path it creates 0600; see VaultStore+Backup.swift).
    case backup

    /// Operations that name one item.
    var needsItem: Bool { [.put, .get, .delete, .state, .rotate].contains(self) }
}

public struct ItemReference: Sendable, Equatable {
    public let service: String
    public let account: String
    public init(service: String, account: String) {
        self.service = service
        self.account = account
    }
}

/// One request. A flat record: which fields matter depends on `operation`, and decoding
/// checks that the ones an operation needs are present.
public struct Request {
    public var operation: Operation
    public var item: ItemReference?
    public var label: String?
    public var kind: ItemKind = .generic
    public var policy: String?
    public var allowedExecutables: [String] = []
    public var reuseSeconds: UInt32 = 0
    public var update = false
    public var secret: SecureBytes?
    public var appPassword: SecureBytes?
    public var reason: String?
    public var allowInteraction = true
    /// Audit queries: µs since the epoch, and the sequence number after which to continue.
    public var since: Int64?
    public var until: Int64?
    public var afterSeq: Int64?
    public var follow = false
    /// `audit` for an export (root only): each entry also carries its row bytes and previous
    /// MAC, and an `auditExportHeader` message comes first.
    public var withRows = false
    /// `auditVerifyExport`: the header of the file being checked.
    public var exportHeader: AuditExportHeader?
    /// Set by the Secret Service agent: the pid the bus names as the D-Bus sender. A claim from
    /// a same-user process, never an identity: the broker records it as claimed only.
    public var claimedPID: Int32?
    /// `put --update`: only if the item is still at this generation (else *conflict*).
    public var ifGeneration: UInt64?
    /// `rotate`: the lease's lifetime, 1 to `Limits.maxRotationSeconds`.
    public var timeoutSeconds: UInt32?
    /// `put`: when the secret expires, µs since the epoch.
    public var expires: Int64?
    /// `search`: the pairs every returned item's attribute map must hold (SearchMessages.swift).
    public var searchAttributes: [String: String] = [:]

    public init(_ operation: Operation, item: ItemReference? = nil) {
        self.operation = operation
        self.item = item
    }
}

public struct Prompt: Sendable {
    public enum Style: UInt8, Sendable { case echoOff = 0, echoOn = 1 }
    public enum Purpose: UInt8, Sendable { case authentication = 0, appPassword = 1 }
    public let style: Style
    public let purpose: Purpose
    public let text: String
    public init(style: Style, purpose: Purpose, text: String) {
        self.style = style
        self.purpose = purpose
        self.text = text
    }
}

public struct Notice: Sendable {
    public enum Style: UInt8, Sendable { case info = 0, error = 1 }
    public let style: Style
    public let text: String
    /// Set on the broker's announce before an authentication; `text` then says the same for a
    /// client that shows only text.
    public let announcement: Announcement?
    public init(style: Style, text: String, announcement: Announcement? = nil) {
        self.style = style
        self.text = text
        self.announcement = announcement
    }

    public init(announcing a: Announcement) {
        var text = "keyhold: \(a.executable) (pid \(a.pid)) asks for \(a.service) / \(a.account)"
        if let reason = a.reason, !reason.isEmpty { text += ": \(reason)" }
        // The summary must fit a text field; the fields themselves are whole.
        var fitted = String.UnicodeScalarView()
        var bytes = 0
        for u in text.unicodeScalars {
            bytes += UTF8.width(u)
            if bytes > Limits.maxTextBytes { break }
            fitted.append(u)
        }
        self.init(style: .info, text: String(fitted), announcement: a)
    }
}

/// Who asks for an item, as the broker verified it (the executable and pid the kernel gave
/// it), and what the caller said (names and reason), in separate fields: a client shows the
/// caller's words escaped and the verified executable where they cannot reach it.
public struct Announcement: Sendable, Equatable {
    public let executable: String
    public let pid: Int32
    public let service: String
    public let account: String
    public let reason: String?
    public init(executable: String, pid: Int32, service: String, account: String, reason: String?) {
        self.executable = executable
        self.pid = pid
        self.service = service
        self.account = account
        self.reason = reason
    }
}

/// Metadata of one item, as `ls` shows it. Never the secret.
public struct ItemInfo: Sendable, Equatable {
    public var id: String
    public var service: String
    public var account: String
    public var label: String
    public var kind: ItemKind
    public var policy: String
    public var allowedExecutables: [String]
    public var reuseSeconds: UInt32
    public var createdAt: Int64
    public var updatedAt: Int64
    /// Grows on every change of the secret or policy (see VaultStore+Generation).
    public var generation: UInt64
    /// When the secret expires (µs since the epoch), if it was given one.
    public var expires: Int64?
    public init(id: String, service: String, account: String, label: String, kind: ItemKind, policy: String,
                allowedExecutables: [String], reuseSeconds: UInt32, createdAt: Int64, updatedAt: Int64,
                generation: UInt64 = 0, expires: Int64? = nil) {
        self.expires = expires
        self.id = id; self.service = service; self.account = account; self.label = label; self.kind = kind
        self.policy = policy; self.allowedExecutables = allowedExecutables; self.reuseSeconds = reuseSeconds
        self.createdAt = createdAt; self.updatedAt = updatedAt; self.generation = generation
    }
}

/// One audit entry as a caller may see it: what it says (the same fields an export row's
/// readable part has) and where it sits in the chain.
public struct AuditEntryInfo: Sendable, Equatable {
    public var seq: Int64
    public var readable: AuditReadableFields
    /// Hex MACs, so an export can be verified on its own.
    public var mac: String
    public var previousMAC: String
    /// Exports only: the canonical row bytes the MAC covers (at most `AuditExportRow.maxRowBytes`).
    public var row: [UInt8]?
    public init(seq: Int64, readable: AuditReadableFields, mac: String, previousMAC: String, row: [UInt8]? = nil) {
        self.seq = seq; self.readable = readable; self.mac = mac; self.previousMAC = previousMAC; self.row = row
    }

    /// An exported entry as the wire carries it (MACs in hex).
    public init(_ r: AuditExportRow) {
        self.init(seq: r.seq, readable: r.readable, mac: Hex.encode(r.mac), previousMAC: Hex.encode(r.previousMAC), row: r.row)
    }

    /// The exported entry this describes; nil without row bytes or with MACs that are not hex.
    public var exportRow: AuditExportRow? {
        guard let row, let m = Hex.decode(mac), let p = Hex.decode(previousMAC) else { return nil }
        return AuditExportRow(seq: seq, readable: readable, row: row, previousMAC: p, mac: m)
    }
}

/// The final answer to a request.
public struct Response {
    public var outcome: Outcome
    /// A human-readable detail; never a secret or another user's data.
    public var detail: String?
    public var secret: SecureBytes?
    /// `state`: available, requires-authentication, invalidated, expired, not-found.
    public var state: String?
    /// Lockout: seconds until the next attempt is allowed.
    public var secondsLeft: UInt64?
    /// A count (verified audit entries, pruned entries, items that a change would invalidate).
    public var count: UInt64?
    /// Audit verification: first bad sequence number.
    public var firstBadSeq: UInt64?
    /// Biometry: enrolled finger names and the reader.
    public var fingers: [String] = []
    public var reader: String?
    /// `get`/`rotate`: the item's generation and expiry (µs since the epoch) with its secret.
    public var generation: UInt64?
    public var expires: Int64?

    public init(_ outcome: Outcome, detail: String? = nil) {
        self.outcome = outcome
        self.detail = detail
    }
}

public enum ClientMessage {
    case request(Request)
    case answer(SecureBytes)
    case cancel
    /// `auditVerifyExport`: the next rows of the file, in file order (never empty).
    case auditRows([AuditEntryInfo])
    /// `auditVerifyExport`: the file has no more rows.
    case auditRowsEnd
    /// `rotate`: the new secret the command produced, with the expiry `rotate --expires` gave.
    case rotated(SecureBytes, expires: Int64?)
}

public enum BrokerMessage {
    case prompt(Prompt)
    case notice(Notice)
    case items([ItemInfo])
    case auditEntries([AuditEntryInfo])
    /// Export: where the exported chain starts and ends; sent before its rows.
    case auditExportHeader(AuditExportHeader)
    /// `rotate`: the lease is held; the current secret at `generation` for the command.
    case rotationCurrent(SecureBytes, generation: UInt64)
    case response(Response)
}
