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
        let v = e.readable
        var pairs: [(String, JSON)] = [
            ("seq", .number(e.seq)), ("time", .string(Time.iso8601(v.time))), ("uid", .number(Int64(v.callerUID))),
            ("pid", .number(Int64(v.callerPID))), ("executable", .string(v.executable)), ("operation", .string(v.operation)),
            ("item_id", v.itemID.map { .string($0) } ?? .null), ("service", v.service.map { .string($0) } ?? .null),
            ("account", v.account.map { .string($0) } ?? .null), ("decision", .string(v.decision)),
            ("method", .string(v.method)), ("reason", v.reason.map { .string($0) } ?? .null), ("outcome", .string(v.outcome)),
        ]
        if withMACs {
            pairs.append(("prev_mac", .string(e.previousMAC)))
            pairs.append(("mac", .string(e.mac)))
            pairs.append(("row", .string(Hex.encode(e.row ?? []))))
        }
        return JSON.object(pairs)
    }

    static func row(_ e: AuditEntryInfo) -> [String] {
        let v = e.readable
        return [String(e.seq), Time.iso8601(v.time), String(v.callerUID), String(v.callerPID), v.executable, v.operation,
                item(v), v.decision, v.method, v.outcome, v.reason ?? ""]
    }

    /// The entry's item as a table shows it: SERVICE/ACCOUNT, or "-" for an entry without one.
    static func item(_ v: AuditReadableFields) -> String {
        v.service.map { "\($0)/\(v.account ?? "")" } ?? "-"
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
                Output.out(Output.table((printedHeader ? [] : [header]) + entries.map(row), width: TextWidth.table))
                printedHeader = true
            }
            return true
        }
        if !asJSON && !printedHeader { Output.out(Output.table([header], width: TextWidth.table)) }
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
