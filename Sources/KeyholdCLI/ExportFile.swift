import Glibc
import KeyholdClient
import KeyholdCore

/// The export file's lines. Line 1 is the header; every other line is one entry. The readable
/// fields are checked against the row bytes by the broker, so what a person reads is what the
/// MACs vouch for.
enum ExportFile {
    static let formatKey = "keyhold_audit_export"
    static let headerKeys: Set<String> = [formatKey, "start_seq", "start_mac", "through_seq", "through_mac", "entries", "tag"]
    static let rowKeys: Set<String> = ["seq", "time", "uid", "pid", "executable", "operation", "item_id", "service", "account",
                                       "decision", "method", "reason", "outcome", "prev_mac", "mac", "row"]

    static func headerLine(_ h: AuditExportHeader) -> String {
        JSON.object([
            (formatKey, .number(1)), ("start_seq", .number(h.startSeq)), ("start_mac", .string(Hex.encode(h.startMAC))),
            ("through_seq", .number(h.throughSeq)), ("through_mac", .string(Hex.encode(h.throughMAC))),
            ("entries", .number(h.count)), ("tag", .string(Hex.encode(h.tag))),
        ])
    }

    static func rowLine(_ e: AuditEntryInfo) -> String { AuditCommands.json(e, withMACs: true) }

    static func header(_ line: [UInt8]) -> AuditExportHeader? {
        guard let o = JSONLine.parse(line), Set(o.keys) == headerKeys, o[formatKey]?.number == 1,
              let start = o["start_seq"]?.number, let through = o["through_seq"]?.number, start >= 0, through >= start,
              o["entries"]?.number == through - start,
              let sm = mac(o["start_mac"]), let tm = mac(o["through_mac"]), let tag = mac(o["tag"]) else { return nil }
        return AuditExportHeader(startSeq: start, startMAC: sm, throughSeq: through, throughMAC: tm, tag: tag)
    }

    static func row(_ line: [UInt8]) -> AuditEntryInfo? {
        guard let o = JSONLine.parse(line), Set(o.keys) == rowKeys,
              let seq = o["seq"]?.number, seq >= 1,
              let timeText = o["time"]?.string, let time = Time.parse(timeText),
              let uid = o["uid"]?.number, let uid32 = UInt32(exactly: uid),
              let pid = o["pid"]?.number, let pid32 = Int32(exactly: pid),
              let executable = text(o["executable"]), let operation = text(o["operation"]),
              let itemID = optionalText(o["item_id"]), let service = optionalText(o["service"]),
              let account = optionalText(o["account"]), let reason = optionalText(o["reason"]),
              let decision = text(o["decision"]), let method = text(o["method"]), let outcome = text(o["outcome"]),
              let prev = o["prev_mac"]?.string, mac(o["prev_mac"]) != nil,
              let m = o["mac"]?.string, mac(o["mac"]) != nil,
              let rowText = o["row"]?.string, rowText.utf8.count <= 2 * AuditExportRow.maxRowBytes,
              let row = Hex.decode(rowText) else { return nil }
        let readable = AuditReadableFields(time: time, callerUID: uid32, callerPID: pid32, executable: executable,
                                           operation: operation, itemID: itemID, service: service, account: account,
                                           decision: decision, method: method, reason: reason, outcome: outcome)
        return AuditEntryInfo(seq: seq, readable: readable, mac: m, previousMAC: prev, row: row)
    }

    private static func mac(_ v: JSONLine.Value?) -> [UInt8]? {
        guard let s = v?.string, let b = Hex.decode(s), b.count == AuditExportRow.macBytes else { return nil }
        return b
    }

    /// Text the wire can carry (within the limit, no NUL); anything else is not a row the broker wrote.
    private static func text(_ v: JSONLine.Value?) -> String? {
        guard let s = v?.string, s.utf8.count <= Limits.maxTextBytes, !s.utf8.contains(0) else { return nil }
        return s
    }

    private static func optionalText(_ v: JSONLine.Value?) -> String?? {
        guard let v else { return nil }
        if case .null = v { return .some(nil) }
        return text(v).map { .some($0) }
    }
}

/// Lines of a file, read in blocks; a line longer than `maxLine` ends reading as a failure.
struct LineReader {
    static let maxLine = 1 << 20
    let fd: Int32
    private var buffer: [UInt8] = []
    private var start = 0
    private var eof = false
    private(set) var failed = false
    private(set) var lineNumber = 0

    init(fd: Int32) { self.fd = fd }

    mutating func next() -> [UInt8]? {
        while true {
            if let nl = buffer[start...].firstIndex(of: 0x0a) {
                let line = Array(buffer[start..<nl])
                start = nl + 1
                lineNumber += 1
                return line
            }
            if eof || failed {
                guard start < buffer.count else { return nil }
                let line = Array(buffer[start...])
                start = buffer.count
                lineNumber += 1
                return line
            }
            if start > 0 { buffer.removeFirst(start); start = 0 }
            guard buffer.count <= Self.maxLine else { failed = true; buffer = []; return nil }
            var chunk = [UInt8](repeating: 0, count: 64 * 1024)
            let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if n < 0 {
                if errno == EINTR { continue }
                failed = true
            } else if n == 0 {
                eof = true
            } else {
                buffer.append(contentsOf: chunk[0..<n])
            }
        }
    }
}
