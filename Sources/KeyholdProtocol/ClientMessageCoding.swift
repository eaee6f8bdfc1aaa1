import KeyholdCore

// Decoding of what a client sends (the broker decodes it: untrusted input). Its encoding is
// the client's (KeyholdClient/ClientCoding.swift).

extension ClientMessage {
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
