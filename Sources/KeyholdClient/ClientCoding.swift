import KeyholdCore
import KeyholdProtocol

// The client's half of the wire protocol: encoding what it sends and decoding (strictly, as
// untrusted input) what the broker answers. The broker's half is in KeyholdProtocol.

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
}

extension BrokerMessage {
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
