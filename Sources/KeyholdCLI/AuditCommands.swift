import Glibc
import KeyholdClient
import KeyholdCore

/// `keyhold audit …`: show, verify, export, prune.
enum AuditCommands {
    static func time(_ c: ParsedCommand, _ option: String, required: Bool) throws(KeyholdError) -> Int64? {
        guard let text = c.value(option) else {
            if required { throw .invalidRequest("\(option) TIME is required") }
            return nil
        }
        guard let t = Time.parse(text) else { throw .invalidRequest("cannot read the time '\(text)' (use 2026-12-02T10:00:00Z, 2026-12-02 or @EPOCH)") }
        return t
    }

    static func itemFilter(_ c: ParsedCommand) throws(KeyholdError) -> (service: String, account: String)? {
        guard let text = c.value("--item") else { return nil }
        // The last `/`: service names such as git's `git:https://host/path` contain slashes.
        guard let slash = text.lastIndex(of: "/"), slash != text.startIndex, text.index(after: slash) != text.endIndex else {
            throw .invalidRequest("--item wants SERVICE/ACCOUNT")
        }
        return (String(text[..<slash]), String(text[text.index(after: slash)...]))
    }

    static func json(_ e: AuditEntryInfo, withMACs: Bool) -> String {
        var pairs: [(String, JSON)] = [
            ("seq", .number(e.seq)), ("time", .string(Time.iso8601(e.time))), ("uid", .number(Int64(e.uid))),
            ("pid", .number(Int64(e.pid))), ("executable", .string(e.executable)), ("operation", .string(e.operation)),
            ("item_id", e.itemID.map { .string($0) } ?? .null), ("service", e.service.map { .string($0) } ?? .null),
            ("account", e.account.map { .string($0) } ?? .null), ("decision", .string(e.decision)),
            ("method", .string(e.method)), ("reason", e.reason.map { .string($0) } ?? .null), ("outcome", .string(e.outcome)),
        ]
        if withMACs {
            pairs.append(("prev_mac", .string(e.previousMAC)))
            pairs.append(("mac", .string(e.mac)))
            pairs.append(("row", .string(Hex.encode(e.row ?? []))))
        }
        return JSON.object(pairs)
    }

    static func row(_ e: AuditEntryInfo) -> [String] {
        let item = e.service.map { "\($0)/\(e.account ?? "")" } ?? "-"
        return [String(e.seq), Time.iso8601(e.time), String(e.uid), String(e.pid), e.executable, e.operation, item,
                e.decision, e.method, e.outcome, e.reason ?? ""]
    }

    static func show(_ vault: Vault, _ c: ParsedCommand) throws(KeyholdError) {
        let asJSON = c.flag("--json")
        let follow = c.flag("--follow")
        var printedHeader = false
        let header = ["SEQ", "TIME", "UID", "PID", "EXECUTABLE", "OPERATION", "ITEM", "DECISION", "METHOD", "OUTCOME", "REASON"]
        try vault.auditEntries(since: try time(c, "--since", required: false), item: try itemFilter(c), follow: follow) { entries in
            if asJSON {
                for e in entries { Output.out(json(e, withMACs: false) + "\n") }
            } else if follow {
                // Streaming: no column alignment across batches, tab-separated instead.
                if !printedHeader { Output.out(header.joined(separator: "\t") + "\n"); printedHeader = true }
                for e in entries { Output.out(row(e).map { Printable.escape($0) }.joined(separator: "\t") + "\n") }
            } else {
                Output.out(Output.table((printedHeader ? [] : [header]) + entries.map(row)))
                printedHeader = true
            }
            return true
        }
        if !asJSON && !printedHeader { Output.out(Output.table([header])) }
    }

    static func verify(_ vault: Vault) throws(KeyholdError) -> Int32 {
        let v = try vault.verifyAudit()
        if v.verified {
            Output.out("audit chain verified: \(v.count) entries\n")
            return 0
        }
        // A user is told where only when the first bad entry is one of theirs.
        let at = v.firstBadSeq.map { " at entry \($0)" } ?? ""
        Output.out("audit chain BROKEN\(at): \(Printable.escape(v.problem ?? "altered"))\n")
        return Int32(Outcome.integrityFailure.rawValue)
    }

    /// `audit export --until TIME FILE`: a header line (where the exported chain starts and
    /// ends, tagged by the broker), then one line per entry with its readable fields, its
    /// canonical row bytes (hex) and its MACs. FILE must not exist; it is created 0600 and
    /// removed again if the export does not complete.
    static func export(_ vault: Vault, _ c: ParsedCommand) throws(KeyholdError) {
        let until = try time(c, "--until", required: true)!
        let path = c.positionals[0]
        let fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw .other("cannot create \(path): \(String(cString: strerror(errno)))") }
        var complete = false
        defer {
            close(fd)
            if !complete { unlink(path) }
        }
        var written = true
        var writeError: Int32 = 0
        func put(_ line: String) {
            guard written else { return }
            // All of it or a failure: a full disk must not leave a silent gap.
            written = DescriptorIO.writeAll(fd, line + "\n") == 0
            if !written { writeError = errno }
        }
        let count: UInt64
        do throws(KeyholdError) {
            count = try vault.exportAudit(until: until, header: { put(ExportFile.headerLine($0)) }, rows: { entries in
                for e in entries { put(ExportFile.rowLine(e)) }
                return written
            })
        } catch {
            if !written { throw .other("cannot write \(path): \(String(cString: strerror(writeError)))") }
            throw error
        }
        guard fsync(fd) == 0 else { throw .other("cannot write \(path): \(String(cString: strerror(errno)))") }
        complete = true
        Output.err("exported \(count) entries to \(path)")
    }


    /// `audit verify --export FILE`: the broker checks the file's rows with its audit key.
    static func verifyExport(_ vault: Vault, path: String) throws(KeyholdError) -> Int32 {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw .other("cannot open \(path): \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        var reader = LineReader(fd: fd)
        let broken = Int32(Outcome.integrityFailure.rawValue)
        guard let first = reader.next(), let header = ExportFile.header(first) else {
            Output.out("export BROKEN at its header: line 1 is not a Keyhold audit export header\n")
            return broken
        }
        // A line that cannot be read ends the stream; the broker then names what came before.
        var malformed: (line: Int, seq: Int64?)?
        let v = try vault.verifyAuditExport(header: header) { () -> [AuditEntryInfo]? in
            guard malformed == nil else { return nil }
            var chunk: [AuditEntryInfo] = []
            while chunk.count < 512, let line = reader.next() {
                guard let row = ExportFile.row(line) else {
                    malformed = (reader.lineNumber, JSONLine.parse(line)?["seq"]?.number)
                    break
                }
                chunk.append(row)
            }
            return chunk.isEmpty ? nil : chunk
        }
        if let m = malformed, v.verified || v.problem == AuditExportProblem.truncated.rawValue {
            let entry = m.seq.map { " (entry \($0))" } ?? ""
            Output.out("export BROKEN at line \(m.line)\(entry): not a valid export row\n")
            return broken
        }
        if reader.failed {
            throw .other("cannot read \(path)")
        }
        if v.verified {
            Output.out("export verified: \(v.count) entries\n")
            return 0
        }
        if v.firstBadSeq == 0 || v.problem == AuditExportProblem.header.rawValue {
            Output.out("export BROKEN at its header: \(Printable.escape(v.problem ?? "altered"))\n")
        } else {
            Output.out("export BROKEN at entry \(v.firstBadSeq.map(String.init) ?? "?"): \(Printable.escape(v.problem ?? "altered"))\n")
        }
        return broken
    }

    static func prune(_ vault: Vault, _ c: ParsedCommand) throws(KeyholdError) {
        let until = try time(c, "--until", required: true)!
        let n = try vault.pruneAudit(until: until)
        Output.err("pruned \(n) entries; a checkpoint keeps the rest of the chain verifiable")
    }
}

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
        return AuditEntryInfo(seq: seq, time: time, uid: uid32, pid: pid32, executable: executable, operation: operation,
                              itemID: itemID, service: service, account: account, decision: decision, method: method,
                              reason: reason, outcome: outcome, mac: m, previousMAC: prev, row: row)
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

/// Reads one flat JSON object per line: string, integer and null values only, as the export
/// writes them. Strict: duplicate keys, other value kinds or trailing bytes are refused. The
/// file may have been edited by anyone, so every read is bounded.
enum JSONLine {
    enum Value: Equatable {
        case string(String), number(Int64), null
        var string: String? { if case .string(let s) = self { s } else { nil } }
        var number: Int64? { if case .number(let n) = self { n } else { nil } }
    }

    static func parse(_ line: [UInt8]) -> [String: Value]? {
        var p = Parser(bytes: line)
        return p.object()
    }

    private struct Parser {
        let bytes: [UInt8]
        var i = 0

        mutating func skipSpace() {
            while i < bytes.count, [0x20, 0x09, 0x0d].contains(bytes[i]) { i += 1 }
        }

        mutating func eat(_ c: UInt8) -> Bool {
            skipSpace()
            guard i < bytes.count, bytes[i] == c else { return false }
            i += 1
            return true
        }

        mutating func object() -> [String: Value]? {
            guard eat(UInt8(ascii: "{")) else { return nil }
            var out: [String: Value] = [:]
            if eat(UInt8(ascii: "}")) { return atEnd() ? out : nil }
            repeat {
                skipSpace()
                guard let key = string(), eat(UInt8(ascii: ":")), out[key] == nil, let v = value() else { return nil }
                out[key] = v
            } while eat(UInt8(ascii: ","))
            guard eat(UInt8(ascii: "}")), atEnd() else { return nil }
            return out
        }

        mutating func atEnd() -> Bool {
            skipSpace()
            return i == bytes.count
        }

        mutating func value() -> Value? {
            skipSpace()
            guard i < bytes.count else { return nil }
            switch bytes[i] {
            case UInt8(ascii: "\""): return string().map { .string($0) }
            case UInt8(ascii: "n"):
                guard bytes.count - i >= 4, Array(bytes[i..<i + 4]) == Array("null".utf8) else { return nil }
                i += 4
                return .null
            default: return number().map { .number($0) }
            }
        }

        mutating func number() -> Int64? {
            let start = i
            if i < bytes.count, bytes[i] == UInt8(ascii: "-") { i += 1 }
            let digits = i
            while i < bytes.count, (48...57).contains(bytes[i]), i - digits < 19 { i += 1 }
            guard i > digits, i == bytes.count || !(48...57).contains(bytes[i]) else { return nil }
            return Int64(String(decoding: bytes[start..<i], as: UTF8.self))
        }

        mutating func hex4() -> UInt32? {
            guard bytes.count - i >= 4 else { return nil }
            var v: UInt32 = 0
            for _ in 0..<4 {
                let c = bytes[i]
                let n: UInt32
                switch c {
                case 48...57: n = UInt32(c - 48)
                case 97...102: n = UInt32(c - 87)
                case 65...70: n = UInt32(c - 55)
                default: return nil
                }
                v = v << 4 | n
                i += 1
            }
            return v
        }

        mutating func string() -> String? {
            guard i < bytes.count, bytes[i] == UInt8(ascii: "\"") else { return nil }
            i += 1
            var out: [UInt8] = []
            while i < bytes.count {
                let c = bytes[i]
                i += 1
                switch c {
                case UInt8(ascii: "\""):
                    return String(validating: out, as: UTF8.self)
                case UInt8(ascii: "\\"):
                    guard i < bytes.count else { return nil }
                    let e = bytes[i]
                    i += 1
                    switch e {
                    case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): out.append(e)
                    case UInt8(ascii: "n"): out.append(0x0a)
                    case UInt8(ascii: "r"): out.append(0x0d)
                    case UInt8(ascii: "t"): out.append(0x09)
                    case UInt8(ascii: "b"): out.append(0x08)
                    case UInt8(ascii: "f"): out.append(0x0c)
                    case UInt8(ascii: "u"):
                        guard var scalar = hex4() else { return nil }
                        if (0xd800...0xdbff).contains(scalar) {
                            // A surrogate pair: the low half must follow.
                            guard bytes.count - i >= 6, bytes[i] == UInt8(ascii: "\\"), bytes[i + 1] == UInt8(ascii: "u") else { return nil }
                            i += 2
                            guard let low = hex4(), (0xdc00...0xdfff).contains(low) else { return nil }
                            scalar = 0x10000 + ((scalar - 0xd800) << 10) + (low - 0xdc00)
                        }
                        guard let u = Unicode.Scalar(scalar) else { return nil }
                        out.append(contentsOf: Array(String(Character(u)).utf8))
                    default: return nil
                    }
                default:
                    guard c >= 0x20 else { return nil }
                    out.append(c)
                }
            }
            return nil
        }
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
