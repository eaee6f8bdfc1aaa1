import KeyholdCore

// The wire numbers of message types and field tags: never reused, never renumbered.

package enum MessageType {
    package static let request: UInt8 = 1, answer: UInt8 = 2, cancel: UInt8 = 3, auditRows: UInt8 = 4, auditRowsEnd: UInt8 = 5
    package static let rotated: UInt8 = 6, rotationCurrent: UInt8 = 16
    package static let prompt: UInt8 = 10, notice: UInt8 = 11, response: UInt8 = 12, items: UInt8 = 13, audit: UInt8 = 14
    package static let exportHeader: UInt8 = 15
}

package enum NoticeTag {
    package static let style: UInt8 = 1, text: UInt8 = 2, executable: UInt8 = 3, pid: UInt8 = 4, service: UInt8 = 5, account: UInt8 = 6
    package static let reason: UInt8 = 7
    package static let all: TagSet = TagSet(1...7)
}

package enum RequestTag {
    package static let operation: UInt8 = 1, service: UInt8 = 2, account: UInt8 = 3, label: UInt8 = 4, kind: UInt8 = 5
    package static let policy: UInt8 = 6, allowExe: UInt8 = 7, reuse: UInt8 = 8, update: UInt8 = 9, secret: UInt8 = 10
    package static let appPassword: UInt8 = 11, reason: UInt8 = 12, noInteraction: UInt8 = 13, since: UInt8 = 14
    package static let afterSeq: UInt8 = 15, follow: UInt8 = 16, until: UInt8 = 17, withRows: UInt8 = 18
    package static let startSeq: UInt8 = 19, startMAC: UInt8 = 20, throughSeq: UInt8 = 21, throughMAC: UInt8 = 22, exportTag: UInt8 = 23
    package static let claimedPID: UInt8 = 24
    package static let ifGeneration: UInt8 = 25, timeout: UInt8 = 26, expires: UInt8 = 27, searchPair: UInt8 = 28
    package static let exportHeader: [UInt8] = [startSeq, startMAC, throughSeq, throughMAC, exportTag]
    package static let all: TagSet = TagSet(1...28)
}

package enum ResponseTag {
    package static let outcome: UInt8 = 1, detail: UInt8 = 2, secret: UInt8 = 3, state: UInt8 = 4, secondsLeft: UInt8 = 5
    package static let count: UInt8 = 6, firstBad: UInt8 = 7, finger: UInt8 = 8, reader: UInt8 = 9
    package static let generation: UInt8 = 10, expires: UInt8 = 11
    package static let all: TagSet = TagSet(1...11)
}

package enum ListTag {
    package static let entry: UInt8 = 1
}

package enum ItemTag {
    package static let id: UInt8 = 1, service: UInt8 = 2, account: UInt8 = 3, label: UInt8 = 4, kind: UInt8 = 5
    package static let policy: UInt8 = 6, allowExe: UInt8 = 7, reuse: UInt8 = 8, created: UInt8 = 9, updated: UInt8 = 10
    package static let generation: UInt8 = 11, expires: UInt8 = 12
    package static let all: TagSet = TagSet(1...12)
}

package enum AuditTag {
    package static let seq: UInt8 = 1, time: UInt8 = 2, uid: UInt8 = 3, pid: UInt8 = 4, exe: UInt8 = 5, op: UInt8 = 6
    package static let itemID: UInt8 = 7, service: UInt8 = 8, account: UInt8 = 9, decision: UInt8 = 10, method: UInt8 = 11
    package static let reason: UInt8 = 12, outcome: UInt8 = 13, mac: UInt8 = 14, previousMAC: UInt8 = 15, row: UInt8 = 16
    package static let all: TagSet = TagSet(1...16)
}

package enum ExportHeaderTag {
    package static let startSeq: UInt8 = 1, startMAC: UInt8 = 2, throughSeq: UInt8 = 3, throughMAC: UInt8 = 4, tag: UInt8 = 5
    package static let all: TagSet = TagSet(1...5)
}

/// A prompt answer or app password: as long as a PAM response may usefully be.
public let maxAnswerBytes = Limits.maxAnswerBytes

extension FieldSet {
    /// An audit export header under the given tags: a request carries it beside its own
    /// fields, the broker's header message alone; both are checked the same way here.
    package func exportHeader(startSeq: UInt8, startMAC: UInt8, throughSeq: UInt8, throughMAC: UInt8,
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
