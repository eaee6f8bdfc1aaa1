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
        guard let slash = text.firstIndex(of: "/"), slash != text.startIndex, text.index(after: slash) != text.endIndex else {
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
            pairs.append(("time_us", .number(e.time)))
            pairs.append(("prev_mac", .string(e.previousMAC)))
            pairs.append(("mac", .string(e.mac)))
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
                for e in entries { Output.out(row(e).map(Output.printable).joined(separator: "\t") + "\n") }
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
        Output.out("audit chain BROKEN at entry \(v.firstBadSeq.map(String.init) ?? "?"): \(v.problem ?? "altered")\n")
        return Int32(Outcome.integrityFailure.rawValue)
    }

    static func export(_ vault: Vault, _ c: ParsedCommand) throws(KeyholdError) {
        let until = try time(c, "--until", required: true)
        let path = c.positionals[0]
        let fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw .other("cannot create \(path): \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        var count = 0
        try vault.auditEntries(until: until) { entries in
            for e in entries { Output.write(fd, json(e, withMACs: true) + "\n") }
            count += entries.count
            return true
        }
        guard fsync(fd) == 0 else { throw .other("cannot write \(path)") }
        Output.err("exported \(count) entries to \(path)")
    }

    static func prune(_ vault: Vault, _ c: ParsedCommand) throws(KeyholdError) {
        let until = try time(c, "--until", required: true)!
        let n = try vault.pruneAudit(until: until)
        Output.err("pruned \(n) entries; a checkpoint keeps the rest of the chain verifiable")
    }
}
