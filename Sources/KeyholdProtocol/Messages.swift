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

/// One audit entry as a caller may see it.
public struct AuditEntryInfo: Sendable, Equatable {
    public var seq: Int64
    public var time: Int64
    public var uid: UInt32
    public var pid: Int32
    public var executable: String
    public var operation: String
    public var itemID: String?
    public var service: String?
    public var account: String?
    public var decision: String
    public var method: String
    public var reason: String?
    public var outcome: String
    /// Hex MACs, so an export can be verified on its own.
    public var mac: String
    public var previousMAC: String
    /// Exports only: the canonical row bytes the MAC covers (at most `AuditExportRow.maxRowBytes`).
    public var row: [UInt8]?
    public init(seq: Int64, time: Int64, uid: UInt32, pid: Int32, executable: String, operation: String, itemID: String?,
                service: String?, account: String?, decision: String, method: String, reason: String?, outcome: String,
                mac: String, previousMAC: String, row: [UInt8]? = nil) {
        self.seq = seq; self.time = time; self.uid = uid; self.pid = pid; self.executable = executable
        self.operation = operation; self.itemID = itemID; self.service = service; self.account = account
        self.decision = decision; self.method = method; self.reason = reason; self.outcome = outcome
        self.mac = mac; self.previousMAC = previousMAC; self.row = row
    }

    /// An exported entry as the wire carries it (MACs in hex).
    public init(_ r: AuditExportRow) {
        let v = r.readable
        self.init(seq: r.seq, time: v.time, uid: v.callerUID, pid: v.callerPID, executable: v.executable,
                  operation: v.operation, itemID: v.itemID, service: v.service, account: v.account, decision: v.decision,
                  method: v.method, reason: v.reason, outcome: v.outcome, mac: Hex.encode(r.mac),
                  previousMAC: Hex.encode(r.previousMAC), row: r.row)
    }

    /// The exported entry this describes; nil without row bytes or with MACs that are not hex.
    public var exportRow: AuditExportRow? {
        guard let row, let m = Hex.decode(mac), let p = Hex.decode(previousMAC) else { return nil }
        return AuditExportRow(seq: seq, readable: AuditReadableFields(
            time: time, callerUID: uid, callerPID: pid, executable: executable, operation: operation, itemID: itemID,
            service: service, account: account, decision: decision, method: method, reason: reason, outcome: outcome),
            row: row, previousMAC: p, mac: m)
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

// MARK: - Encoding

private enum MessageType {
    static let request: UInt8 = 1, answer: UInt8 = 2, cancel: UInt8 = 3, auditRows: UInt8 = 4, auditRowsEnd: UInt8 = 5
    static let rotated: UInt8 = 6, rotationCurrent: UInt8 = 16
    static let prompt: UInt8 = 10, notice: UInt8 = 11, response: UInt8 = 12, items: UInt8 = 13, audit: UInt8 = 14
    static let exportHeader: UInt8 = 15
}

private enum NoticeTag {
    static let style: UInt8 = 1, text: UInt8 = 2, executable: UInt8 = 3, pid: UInt8 = 4, service: UInt8 = 5, account: UInt8 = 6
    static let reason: UInt8 = 7
    static let all: Set<UInt8> = Set(1...7)
}

private enum RequestTag {
    static let operation: UInt8 = 1, service: UInt8 = 2, account: UInt8 = 3, label: UInt8 = 4, kind: UInt8 = 5
    static let policy: UInt8 = 6, allowExe: UInt8 = 7, reuse: UInt8 = 8, update: UInt8 = 9, secret: UInt8 = 10
    static let appPassword: UInt8 = 11, reason: UInt8 = 12, noInteraction: UInt8 = 13, since: UInt8 = 14
    static let afterSeq: UInt8 = 15, follow: UInt8 = 16, until: UInt8 = 17, withRows: UInt8 = 18
    static let startSeq: UInt8 = 19, startMAC: UInt8 = 20, throughSeq: UInt8 = 21, throughMAC: UInt8 = 22, exportTag: UInt8 = 23
    static let claimedPID: UInt8 = 24
    static let ifGeneration: UInt8 = 25, timeout: UInt8 = 26, expires: UInt8 = 27, searchPair: UInt8 = 28
    static let exportHeader: Set<UInt8> = [startSeq, startMAC, throughSeq, throughMAC, exportTag]
    static let all: Set<UInt8> = Set(1...28)
}

private enum ResponseTag {
    static let outcome: UInt8 = 1, detail: UInt8 = 2, secret: UInt8 = 3, state: UInt8 = 4, secondsLeft: UInt8 = 5
    static let count: UInt8 = 6, firstBad: UInt8 = 7, finger: UInt8 = 8, reader: UInt8 = 9
    static let generation: UInt8 = 10, expires: UInt8 = 11
    static let all: Set<UInt8> = Set(1...11)
}

private enum ListTag {
    static let entry: UInt8 = 1
}

private enum ItemTag {
    static let id: UInt8 = 1, service: UInt8 = 2, account: UInt8 = 3, label: UInt8 = 4, kind: UInt8 = 5
    static let policy: UInt8 = 6, allowExe: UInt8 = 7, reuse: UInt8 = 8, created: UInt8 = 9, updated: UInt8 = 10
    static let generation: UInt8 = 11, expires: UInt8 = 12
    static let all: Set<UInt8> = Set(1...12)
}

private enum AuditTag {
    static let seq: UInt8 = 1, time: UInt8 = 2, uid: UInt8 = 3, pid: UInt8 = 4, exe: UInt8 = 5, op: UInt8 = 6
    static let itemID: UInt8 = 7, service: UInt8 = 8, account: UInt8 = 9, decision: UInt8 = 10, method: UInt8 = 11
    static let reason: UInt8 = 12, outcome: UInt8 = 13, mac: UInt8 = 14, previousMAC: UInt8 = 15, row: UInt8 = 16
    static let all: Set<UInt8> = Set(1...16)
}

private enum ExportHeaderTag {
    static let startSeq: UInt8 = 1, startMAC: UInt8 = 2, throughSeq: UInt8 = 3, throughMAC: UInt8 = 4, tag: UInt8 = 5
    static let all: Set<UInt8> = Set(1...5)
}

/// A prompt answer or app password: as long as a PAM response may usefully be.
public let maxAnswerBytes = Limits.maxAnswerBytes

extension ClientMessage {
    public func encode() -> SecureBytes {
        switch self {
        case .cancel:
            return PayloadEncoder.encode(type: MessageType.cancel, fields: [])
        case .answer(let s):
            return PayloadEncoder.encode(type: MessageType.answer, fields: [.secret(1, s)])
        case .auditRows(let rows):
            return PayloadEncoder.encode(type: MessageType.auditRows,
                                         fields: rows.map { Field(ListTag.entry, .nested(BrokerMessage.fields(of: $0))) })
        case .auditRowsEnd:
            return PayloadEncoder.encode(type: MessageType.auditRowsEnd, fields: [])
        case .rotated(let s, let expires):
            return PayloadEncoder.encode(type: MessageType.rotated, fields: RotationWire.rotatedFields(s, expires))
        case .request(let r):
            var f: [Field] = [.number(RequestTag.operation, UInt64(r.operation.rawValue))]
            if let item = r.item {
                f.append(.text(RequestTag.service, item.service))
                f.append(.text(RequestTag.account, item.account))
            }
            if let label = r.label { f.append(.text(RequestTag.label, label)) }
            if r.operation == .put { f.append(.number(RequestTag.kind, UInt64(r.kind.rawValue))) }
            if let p = r.policy { f.append(.text(RequestTag.policy, p)) }
            for exe in r.allowedExecutables { f.append(.text(RequestTag.allowExe, exe)) }
            if r.reuseSeconds != 0 { f.append(.number(RequestTag.reuse, UInt64(r.reuseSeconds))) }
            if r.update { f.append(.flag(RequestTag.update)) }
            if let s = r.secret { f.append(.secret(RequestTag.secret, s)) }
            if let s = r.appPassword { f.append(.secret(RequestTag.appPassword, s)) }
            if let reason = r.reason { f.append(.text(RequestTag.reason, reason)) }
            if !r.allowInteraction { f.append(.flag(RequestTag.noInteraction)) }
            if let v = r.since { f.append(.number(RequestTag.since, UInt64(bitPattern: v))) }
            if let v = r.until { f.append(.number(RequestTag.until, UInt64(bitPattern: v))) }
            if let v = r.afterSeq { f.append(.number(RequestTag.afterSeq, UInt64(bitPattern: v))) }
            if r.follow { f.append(.flag(RequestTag.follow)) }
            if r.withRows { f.append(.flag(RequestTag.withRows)) }
            if let h = r.exportHeader {
                f.append(.number(RequestTag.startSeq, UInt64(bitPattern: h.startSeq)))
                f.append(Field(RequestTag.startMAC, .bytes(h.startMAC)))
                f.append(.number(RequestTag.throughSeq, UInt64(bitPattern: h.throughSeq)))
                f.append(Field(RequestTag.throughMAC, .bytes(h.throughMAC)))
                f.append(Field(RequestTag.exportTag, .bytes(h.tag)))
            }
            if let pid = r.claimedPID { f.append(.number(RequestTag.claimedPID, UInt64(UInt32(bitPattern: pid)))) }
            if let v = r.ifGeneration { f.append(.number(RequestTag.ifGeneration, v)) }
            if let v = r.timeoutSeconds { f.append(.number(RequestTag.timeout, UInt64(v))) }
            if let v = r.expires { f.append(.number(RequestTag.expires, UInt64(bitPattern: v))) }
            f += SearchWire.fields(r.searchAttributes, tag: RequestTag.searchPair)
            return PayloadEncoder.encode(type: MessageType.request, fields: f)
        }
    }

    /// Splits exported rows into `.auditRows` messages that each fit in one frame.
    public static func auditRowBatches(_ rows: [AuditEntryInfo]) -> [ClientMessage] {
        BrokerMessage.batches(rows, size: { Field(ListTag.entry, .nested(BrokerMessage.fields(of: $0))).encodedCount })
            .map { .auditRows($0) }
    }

    /// Decodes what a client sent. Everything here is untrusted.
    public static func decode(_ payload: SecureBytes) throws(FrameError) -> ClientMessage {
        switch try FieldSet.header(payload) {
        case MessageType.cancel:
            _ = try FieldSet.payload(payload, allowed: [])
            return .cancel
        case MessageType.answer:
            let fs = try FieldSet.payload(payload, allowed: [1])
            guard let s = try fs.secret(1, maxBytes: maxAnswerBytes) else { throw .malformed("answer without value") }
            return .answer(s)
        case MessageType.auditRows:
            let fs = try FieldSet.payload(payload, allowed: [ListTag.entry], repeatable: [ListTag.entry])
            var rows: [AuditEntryInfo] = []
            for e in try fs.nested(ListTag.entry, allowed: AuditTag.all) {
                let row = try BrokerMessage.auditEntry(e)
                // Rows to verify must be complete: row bytes, and MACs of exactly 32 bytes in hex.
                guard row.row != nil, row.seq >= 1, row.mac.utf8.count == 64, row.previousMAC.utf8.count == 64,
                      row.exportRow != nil else {
                    throw .malformed("incomplete audit row")
                }
                rows.append(row)
            }
            guard !rows.isEmpty else { throw .malformed("empty audit row batch") }
            return .auditRows(rows)
        case MessageType.auditRowsEnd:
            _ = try FieldSet.payload(payload, allowed: [])
            return .auditRowsEnd
        case MessageType.rotated:
            let (s, expires) = try RotationWire.decodeRotated(payload)
            return .rotated(s, expires: expires)
        case MessageType.request:
            let fs = try FieldSet.payload(payload, allowed: RequestTag.all, repeatable: [RequestTag.allowExe, RequestTag.searchPair])
            guard let raw = try fs.number(RequestTag.operation), raw <= 255, let op = Operation(rawValue: UInt8(raw)) else {
                throw .malformed("unknown operation")
            }
            var r = Request(op)
            let service = try fs.text(RequestTag.service), account = try fs.text(RequestTag.account)
            switch (service, account) {
            case let (s?, a?): r.item = ItemReference(service: s, account: a)
            case (nil, nil): break
            default: throw .malformed("service and account must come together")
            }
            if op.needsItem && r.item == nil { throw .malformed("operation needs an item") }
            if let item = r.item, item.service.isEmpty || item.account.isEmpty { throw .malformed("empty service or account") }
            r.label = try fs.text(RequestTag.label)
            if let k = try fs.number(RequestTag.kind) {
                guard k <= 255, let kind = ItemKind(rawValue: UInt8(k)) else { throw .malformed("unknown item kind") }
                r.kind = kind
            }
            r.policy = try fs.text(RequestTag.policy)
            r.allowedExecutables = try fs.texts(RequestTag.allowExe)
            guard r.allowedExecutables.count <= Limits.maxAllowedExecutables else { throw .malformed("too many allowed executables") }
            if let reuse = try fs.number(RequestTag.reuse) {
                guard reuse <= UInt64(Limits.maxReuseSeconds) else { throw .malformed("reuse window above \(Limits.maxReuseSeconds) s") }
                r.reuseSeconds = UInt32(reuse)
            }
            r.update = try fs.flag(RequestTag.update)
            r.secret = try fs.secret(RequestTag.secret, maxBytes: Limits.maxSecretBytes)
            r.appPassword = try fs.secret(RequestTag.appPassword, maxBytes: maxAnswerBytes)
            if op == .put && r.secret == nil { throw .malformed("put without a secret") }
            r.reason = try fs.text(RequestTag.reason)
            r.allowInteraction = !(try fs.flag(RequestTag.noInteraction))
            r.since = try fs.number(RequestTag.since).map { Int64(bitPattern: $0) }
            r.until = try fs.number(RequestTag.until).map { Int64(bitPattern: $0) }
            r.afterSeq = try fs.number(RequestTag.afterSeq).map { Int64(bitPattern: $0) }
            r.follow = try fs.flag(RequestTag.follow)
            r.withRows = try fs.flag(RequestTag.withRows)
            if let pid = try fs.number(RequestTag.claimedPID) {
                guard pid > 0, pid <= UInt64(Int32.max) else { throw .malformed("claimed pid out of range") }
                r.claimedPID = Int32(pid)
            }
            if r.withRows && (op != .audit || r.follow || r.since != nil || r.afterSeq != nil || r.item != nil) {
                throw .malformed("rows are for an audit export only, of the whole chain")
            }
            let headerTags = RequestTag.exportHeader.filter { fs.has($0) }
            if op == .auditVerifyExport {
                guard headerTags.count == RequestTag.exportHeader.count else { throw .malformed("export verification needs its header") }
                r.exportHeader = try fs.exportHeader(startSeq: RequestTag.startSeq, startMAC: RequestTag.startMAC,
                                                     throughSeq: RequestTag.throughSeq, throughMAC: RequestTag.throughMAC,
                                                     tag: RequestTag.exportTag)
            } else if !headerTags.isEmpty {
                throw .malformed("export header outside an export verification")
            }
            try RotationWire.decodeRequestFields(fs, into: &r, ifGeneration: RequestTag.ifGeneration,
                                                 timeout: RequestTag.timeout, expires: RequestTag.expires)
            try SearchWire.decodeRequestFields(fs, into: &r, tag: RequestTag.searchPair)
            return .request(r)
        default:
            throw .unexpectedMessage
        }
    }
}

extension BrokerMessage {
    public func encode() -> SecureBytes {
        switch self {
        case .prompt(let p):
            return PayloadEncoder.encode(type: MessageType.prompt, fields: [
                .number(1, UInt64(p.style.rawValue)), .number(2, UInt64(p.purpose.rawValue)), .text(3, p.text),
            ])
        case .notice(let n):
            var fields: [Field] = [.number(NoticeTag.style, UInt64(n.style.rawValue)), .text(NoticeTag.text, n.text)]
            if let a = n.announcement {
                fields += [.text(NoticeTag.executable, a.executable), .number(NoticeTag.pid, UInt64(UInt32(bitPattern: a.pid))),
                           .text(NoticeTag.service, a.service), .text(NoticeTag.account, a.account)]
                if let reason = a.reason { fields.append(.text(NoticeTag.reason, reason)) }
            }
            return PayloadEncoder.encode(type: MessageType.notice, fields: fields)
        case .items(let items):
            return PayloadEncoder.encode(type: MessageType.items, fields: items.map { Field(ListTag.entry, .nested(Self.fields(of: $0))) })
        case .auditEntries(let entries):
            return PayloadEncoder.encode(type: MessageType.audit, fields: entries.map { Field(ListTag.entry, .nested(Self.fields(of: $0))) })
        case .auditExportHeader(let h):
            return PayloadEncoder.encode(type: MessageType.exportHeader, fields: [
                .number(ExportHeaderTag.startSeq, UInt64(bitPattern: h.startSeq)), Field(ExportHeaderTag.startMAC, .bytes(h.startMAC)),
                .number(ExportHeaderTag.throughSeq, UInt64(bitPattern: h.throughSeq)),
                Field(ExportHeaderTag.throughMAC, .bytes(h.throughMAC)), Field(ExportHeaderTag.tag, .bytes(h.tag)),
            ])
        case .rotationCurrent(let s, let generation):
            return PayloadEncoder.encode(type: MessageType.rotationCurrent, fields: RotationWire.currentFields(s, generation))
        case .response(let r):
            var f: [Field] = [.number(ResponseTag.outcome, UInt64(r.outcome.rawValue))]
            if let d = r.detail { f.append(.text(ResponseTag.detail, String(d.utf8.prefix(Limits.maxTextBytes)) ?? "")) }
            if let s = r.secret { f.append(.secret(ResponseTag.secret, s)) }
            if let s = r.state { f.append(.text(ResponseTag.state, s)) }
            if let v = r.secondsLeft { f.append(.number(ResponseTag.secondsLeft, v)) }
            if let v = r.count { f.append(.number(ResponseTag.count, v)) }
            if let v = r.firstBadSeq { f.append(.number(ResponseTag.firstBad, v)) }
            for finger in r.fingers { f.append(.text(ResponseTag.finger, finger)) }
            if let reader = r.reader { f.append(.text(ResponseTag.reader, reader)) }
            if let v = r.generation { f.append(.number(ResponseTag.generation, v)) }
            if let v = r.expires { f.append(.number(ResponseTag.expires, UInt64(bitPattern: v))) }
            return PayloadEncoder.encode(type: MessageType.response, fields: f)
        }
    }

    /// Splits list entries into `.items` messages that each fit in one frame.
    public static func itemBatches(_ items: [ItemInfo]) -> [BrokerMessage] {
        batches(items, size: { Field(ListTag.entry, .nested(fields(of: $0))).encodedCount }).map { .items($0) }
    }

    /// The payloads of `itemBatches(items)`, each entry's fields built once (a listing of
    /// 100,000 items is on the benchmark's clock).
    /// Written field by field into one buffer: no per-field arrays. Item metadata is not secret,
    /// so the buffer is ordinary memory; the same bytes as `BrokerMessage.items(batch).encode()`.
    public static func encodedItemBatches(_ items: [ItemInfo]) -> [SecureBytes] {
        let budget = Frame.maxPayloadBytes - 16
        var out: [SecureBytes] = []
        var buffer: [UInt8] = []
        buffer.reserveCapacity(Frame.maxPayloadBytes)
        func start() { buffer.removeAll(keepingCapacity: true); buffer.append(ProtocolVersion.current); buffer.append(MessageType.items) }
        func flush() { out.append(buffer.withUnsafeBytes { SecureBytes(copying: $0) }) }
        var entry: [UInt8] = []
        entry.reserveCapacity(1024)
        start()
        for i in items {
            entry.removeAll(keepingCapacity: true)
            func header(_ tag: UInt8, _ n: Int) {
                entry.append(tag)
                entry.append(UInt8(truncatingIfNeeded: n >> 24)); entry.append(UInt8(truncatingIfNeeded: n >> 16))
                entry.append(UInt8(truncatingIfNeeded: n >> 8)); entry.append(UInt8(truncatingIfNeeded: n))
            }
            func text(_ tag: UInt8, _ s: String) { header(tag, s.utf8.count); entry.append(contentsOf: s.utf8) }
            func number(_ tag: UInt8, _ v: UInt64) { header(tag, 8); for k in 0..<8 { entry.append(UInt8(truncatingIfNeeded: v >> (56 - 8 * k))) } }
            // Same order as `fields(of:)`.
            text(ItemTag.id, i.id); text(ItemTag.service, i.service); text(ItemTag.account, i.account)
            text(ItemTag.label, i.label); number(ItemTag.kind, UInt64(i.kind.rawValue)); text(ItemTag.policy, i.policy)
            number(ItemTag.reuse, UInt64(i.reuseSeconds)); number(ItemTag.created, UInt64(bitPattern: i.createdAt))
            number(ItemTag.updated, UInt64(bitPattern: i.updatedAt)); number(ItemTag.generation, i.generation)
            if let v = i.expires { number(ItemTag.expires, UInt64(bitPattern: v)) }
            for exe in i.allowedExecutables { text(ItemTag.allowExe, exe) }
            if buffer.count - 2 + 5 + entry.count > budget && buffer.count > 2 {
                flush()
                start()
            }
            let n = entry.count
            buffer.append(ListTag.entry)
            buffer.append(UInt8(truncatingIfNeeded: n >> 24)); buffer.append(UInt8(truncatingIfNeeded: n >> 16))
            buffer.append(UInt8(truncatingIfNeeded: n >> 8)); buffer.append(UInt8(truncatingIfNeeded: n))
            buffer.append(contentsOf: entry)
        }
        if buffer.count > 2 { flush() }
        return out
    }

    /// Splits audit entries into `.auditEntries` messages that each fit in one frame.
    public static func auditBatches(_ entries: [AuditEntryInfo]) -> [BrokerMessage] {
        batches(entries, size: { Field(ListTag.entry, .nested(fields(of: $0))).encodedCount }).map { .auditEntries($0) }
    }

    static func batches<T>(_ all: [T], size: (T) -> Int) -> [[T]] {
        let budget = Frame.maxPayloadBytes - 16
        var out: [[T]] = []
        var current: [T] = []
        var used = 0
        for x in all {
            let n = size(x)
            if used + n > budget && !current.isEmpty {
                out.append(current)
                current = []
                used = 0
            }
            current.append(x)
            used += n
        }
        if !current.isEmpty { out.append(current) }
        return out
    }

    static func fields(of i: ItemInfo) -> [Field] {
        var f: [Field] = [
            .text(ItemTag.id, i.id), .text(ItemTag.service, i.service), .text(ItemTag.account, i.account),
            .text(ItemTag.label, i.label), .number(ItemTag.kind, UInt64(i.kind.rawValue)), .text(ItemTag.policy, i.policy),
            .number(ItemTag.reuse, UInt64(i.reuseSeconds)), .number(ItemTag.created, UInt64(bitPattern: i.createdAt)),
            .number(ItemTag.updated, UInt64(bitPattern: i.updatedAt)), .number(ItemTag.generation, i.generation),
        ]
        if let v = i.expires { f.append(.number(ItemTag.expires, UInt64(bitPattern: v))) }
        for exe in i.allowedExecutables { f.append(.text(ItemTag.allowExe, exe)) }
        return f
    }

    static func fields(of e: AuditEntryInfo) -> [Field] {
        var f: [Field] = [
            .number(AuditTag.seq, UInt64(bitPattern: e.seq)), .number(AuditTag.time, UInt64(bitPattern: e.time)),
            .number(AuditTag.uid, UInt64(e.uid)), .number(AuditTag.pid, UInt64(UInt32(bitPattern: e.pid))),
            .text(AuditTag.exe, e.executable), .text(AuditTag.op, e.operation), .text(AuditTag.decision, e.decision),
            .text(AuditTag.method, e.method), .text(AuditTag.outcome, e.outcome), .text(AuditTag.mac, e.mac),
            .text(AuditTag.previousMAC, e.previousMAC),
        ]
        if let v = e.itemID { f.append(.text(AuditTag.itemID, v)) }
        if let v = e.service { f.append(.text(AuditTag.service, v)) }
        if let v = e.account { f.append(.text(AuditTag.account, v)) }
        if let v = e.reason { f.append(.text(AuditTag.reason, v)) }
        if let v = e.row { f.append(Field(AuditTag.row, .bytes(v))) }
        return f
    }

    /// One audit entry, strictly: the same rules for the broker's entries and a client's rows.
    static func auditEntry(_ e: FieldSet) throws(FrameError) -> AuditEntryInfo {
        guard let seq = try e.number(AuditTag.seq), let time = try e.number(AuditTag.time),
              let uid = try e.number(AuditTag.uid), uid <= UInt64(UInt32.max),
              let pid = try e.number(AuditTag.pid), pid <= UInt64(UInt32.max) else {
            throw .malformed("bad audit entry")
        }
        return AuditEntryInfo(
            seq: Int64(bitPattern: seq), time: Int64(bitPattern: time), uid: UInt32(uid),
            pid: Int32(bitPattern: UInt32(pid)), executable: try e.requiredText(AuditTag.exe),
            operation: try e.requiredText(AuditTag.op), itemID: try e.text(AuditTag.itemID),
            service: try e.text(AuditTag.service), account: try e.text(AuditTag.account),
            decision: try e.requiredText(AuditTag.decision), method: try e.requiredText(AuditTag.method),
            reason: try e.text(AuditTag.reason), outcome: try e.requiredText(AuditTag.outcome),
            mac: try e.requiredText(AuditTag.mac), previousMAC: try e.requiredText(AuditTag.previousMAC),
            row: try e.opaque(AuditTag.row, maxBytes: AuditExportRow.maxRowBytes))
    }

    /// Decodes what the broker sent. The client checks it as strictly as the broker checks it.
    public static func decode(_ payload: SecureBytes) throws(FrameError) -> BrokerMessage {
        switch try FieldSet.header(payload) {
        case MessageType.prompt:
            let fs = try FieldSet.payload(payload, allowed: [1, 2, 3])
            guard let s = try fs.number(1), s <= 1, let style = Prompt.Style(rawValue: UInt8(s)),
                  let p = try fs.number(2), p <= 1, let purpose = Prompt.Purpose(rawValue: UInt8(p)) else {
                throw .malformed("bad prompt")
            }
            return .prompt(Prompt(style: style, purpose: purpose, text: try fs.requiredText(3)))
        case MessageType.notice:
            let fs = try FieldSet.payload(payload, allowed: NoticeTag.all)
            guard let s = try fs.number(NoticeTag.style), s <= 1, let style = Notice.Style(rawValue: UInt8(s)) else { throw .malformed("bad notice") }
            let executable = try fs.text(NoticeTag.executable), pid = try fs.number(NoticeTag.pid)
            let service = try fs.text(NoticeTag.service), account = try fs.text(NoticeTag.account), reason = try fs.text(NoticeTag.reason)
            var announcement: Announcement?
            if let executable {
                guard let pid, pid <= UInt64(UInt32.max), let service, let account else { throw .malformed("bad announce") }
                announcement = Announcement(executable: executable, pid: Int32(bitPattern: UInt32(pid)), service: service,
                                            account: account, reason: reason)
            } else if pid != nil || service != nil || account != nil || reason != nil {
                throw .malformed("announce without an executable")
            }
            return .notice(Notice(style: style, text: try fs.requiredText(NoticeTag.text), announcement: announcement))
        case MessageType.items:
            let fs = try FieldSet.payload(payload, allowed: [ListTag.entry], repeatable: [ListTag.entry])
            var items: [ItemInfo] = []
            for e in try fs.nested(ListTag.entry, allowed: ItemTag.all, repeatable: [ItemTag.allowExe]) {
                guard let k = try e.number(ItemTag.kind), k <= 255, let kind = ItemKind(rawValue: UInt8(k)),
                      let reuse = try e.number(ItemTag.reuse), reuse <= UInt64(Limits.maxReuseSeconds) else {
                    throw .malformed("bad item entry")
                }
                items.append(ItemInfo(
                    id: try e.requiredText(ItemTag.id), service: try e.requiredText(ItemTag.service),
                    account: try e.requiredText(ItemTag.account), label: try e.requiredText(ItemTag.label), kind: kind,
                    policy: try e.requiredText(ItemTag.policy), allowedExecutables: try e.texts(ItemTag.allowExe),
                    reuseSeconds: UInt32(reuse), createdAt: Int64(bitPattern: try e.number(ItemTag.created) ?? 0),
                    updatedAt: Int64(bitPattern: try e.number(ItemTag.updated) ?? 0),
                    generation: try e.number(ItemTag.generation) ?? 0,
                    expires: try e.number(ItemTag.expires).map { Int64(bitPattern: $0) }))
            }
            return .items(items)
        case MessageType.audit:
            let fs = try FieldSet.payload(payload, allowed: [ListTag.entry], repeatable: [ListTag.entry])
            var entries: [AuditEntryInfo] = []
            for e in try fs.nested(ListTag.entry, allowed: AuditTag.all) {
                entries.append(try auditEntry(e))
            }
            return .auditEntries(entries)
        case MessageType.exportHeader:
            let fs = try FieldSet.payload(payload, allowed: ExportHeaderTag.all)
            return .auditExportHeader(try fs.exportHeader(startSeq: ExportHeaderTag.startSeq, startMAC: ExportHeaderTag.startMAC,
                                                          throughSeq: ExportHeaderTag.throughSeq, throughMAC: ExportHeaderTag.throughMAC,
                                                          tag: ExportHeaderTag.tag))
        case MessageType.response:
            let fs = try FieldSet.payload(payload, allowed: ResponseTag.all, repeatable: [ResponseTag.finger])
            guard let o = try fs.number(ResponseTag.outcome), o <= 255, let outcome = Outcome(rawValue: UInt8(o)) else {
                throw .malformed("unknown outcome")
            }
            var r = Response(outcome, detail: try fs.text(ResponseTag.detail))
            r.secret = try fs.secret(ResponseTag.secret, maxBytes: Limits.maxSecretBytes)
            r.state = try fs.text(ResponseTag.state)
            r.secondsLeft = try fs.number(ResponseTag.secondsLeft)
            r.count = try fs.number(ResponseTag.count)
            r.firstBadSeq = try fs.number(ResponseTag.firstBad)
            r.fingers = try fs.texts(ResponseTag.finger)
            r.reader = try fs.text(ResponseTag.reader)
            r.generation = try fs.number(ResponseTag.generation)
            r.expires = try fs.number(ResponseTag.expires).map { Int64(bitPattern: $0) }
            return .response(r)
        case MessageType.rotationCurrent:
            let (s, generation) = try RotationWire.decodeCurrent(payload)
            return .rotationCurrent(s, generation: generation)
        default:
            throw .unexpectedMessage
        }
    }
}

extension FieldSet {
    /// An audit export header under the given tags: a request carries it beside its own
    /// fields, the broker's header message alone; both are checked the same way here.
    fileprivate func exportHeader(startSeq: UInt8, startMAC: UInt8, throughSeq: UInt8, throughMAC: UInt8,
                                  tag: UInt8) throws(FrameError) -> AuditExportHeader {
        func mac(_ t: UInt8) throws(FrameError) -> [UInt8] {
            guard let b = try opaque(t, maxBytes: AuditExportRow.macBytes), b.count == AuditExportRow.macBytes else {
                throw .malformed("export header MAC of the wrong size")
            }
            return b
        }
        guard let start = try number(startSeq), let through = try number(throughSeq),
              start <= UInt64(Int64.max), through <= UInt64(Int64.max), through >= start else {
            throw .malformed("export header range")
        }
        return AuditExportHeader(startSeq: Int64(start), startMAC: try mac(startMAC), throughSeq: Int64(through),
                                 throughMAC: try mac(throughMAC), tag: try mac(tag))
    }
}
