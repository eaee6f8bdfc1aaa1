import KeyholdCore

// Encoding and decoding of what the broker sends (the client decodes it).

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
        let v = e.readable
        var f: [Field] = [
            .number(AuditTag.seq, UInt64(bitPattern: e.seq)), .number(AuditTag.time, UInt64(bitPattern: v.time)),
            .number(AuditTag.uid, UInt64(v.callerUID)), .number(AuditTag.pid, UInt64(UInt32(bitPattern: v.callerPID))),
            .text(AuditTag.exe, v.executable), .text(AuditTag.op, v.operation), .text(AuditTag.decision, v.decision),
            .text(AuditTag.method, v.method), .text(AuditTag.outcome, v.outcome), .text(AuditTag.mac, e.mac),
            .text(AuditTag.previousMAC, e.previousMAC),
        ]
        if let t = v.itemID { f.append(.text(AuditTag.itemID, t)) }
        if let t = v.service { f.append(.text(AuditTag.service, t)) }
        if let t = v.account { f.append(.text(AuditTag.account, t)) }
        if let t = v.reason { f.append(.text(AuditTag.reason, t)) }
        if let b = e.row { f.append(Field(AuditTag.row, .bytes(b))) }
        return f
    }

    /// One audit entry, strictly: the same rules for the broker's entries and a client's rows.
    static func auditEntry(_ e: FieldSet) throws(FrameError) -> AuditEntryInfo {
        guard let seq = try e.number(AuditTag.seq), let time = try e.number(AuditTag.time),
              let uid = try e.number(AuditTag.uid), uid <= UInt64(UInt32.max),
              let pid = try e.number(AuditTag.pid), pid <= UInt64(UInt32.max) else {
            throw .malformed("bad audit entry")
        }
        let readable = AuditReadableFields(
            time: Int64(bitPattern: time), callerUID: UInt32(uid), callerPID: Int32(bitPattern: UInt32(pid)),
            executable: try e.requiredText(AuditTag.exe), operation: try e.requiredText(AuditTag.op),
            itemID: try e.text(AuditTag.itemID), service: try e.text(AuditTag.service),
            account: try e.text(AuditTag.account), decision: try e.requiredText(AuditTag.decision),
            method: try e.requiredText(AuditTag.method), reason: try e.text(AuditTag.reason),
            outcome: try e.requiredText(AuditTag.outcome))
        return AuditEntryInfo(seq: Int64(bitPattern: seq), readable: readable, mac: try e.requiredText(AuditTag.mac),
                              previousMAC: try e.requiredText(AuditTag.previousMAC),
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
