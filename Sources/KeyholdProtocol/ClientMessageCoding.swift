import KeyholdCore

// Encoding and decoding of what a client sends (the broker decodes it: untrusted input).

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
