import KeyholdCore

// Encoding of what the broker sends; the client decodes it (KeyholdClient/ClientCoding.swift).

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

    /// Splits audit entries into `.auditEntries` messages that each fit in one frame.
    public static func auditBatches(_ entries: [AuditEntryInfo]) -> [BrokerMessage] {
        batches(entries, size: { Field(ListTag.entry, .nested(fields(of: $0))).encodedCount }).map { .auditEntries($0) }
    }

    package static func batches<T>(_ all: [T], size: (T) -> Int) -> [[T]] {
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

    package static func fields(of i: ItemInfo) -> [Field] {
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

    package static func fields(of e: AuditEntryInfo) -> [Field] {
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
    package static func auditEntry(_ e: FieldSet) throws(FrameError) -> AuditEntryInfo {
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
}
