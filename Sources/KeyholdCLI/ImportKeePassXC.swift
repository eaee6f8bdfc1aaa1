import Glibc
import KeyholdClient
import KeyholdCore

/// A KeePassXC database through `keepassxc-cli export --format csv`: keepassxc-cli opens it
/// (asking for the database password on the terminal, or reading it from our standard input,
/// which it inherits) and writes the entries to a pipe. Item: service `keepassxc:GROUP/TITLE`,
/// account the user name (else the title), label the URL, kind `password`, secret the
/// password. Notes, TOTP seeds, attributes and attachments stay in the database (counted).
enum ImportKeePassXC {
    static let prefix = "keepassxc:"
    static let exportLimit = 256 << 20

    static func read(database: String, keyFile: String?, noPassword: Bool) throws(KeyholdError) -> ImportSource {
        guard access(database, R_OK) == 0 else { throw .other("cannot read \(database)") }
        guard let cli = RotateCommand.resolve("keepassxc-cli") else {
            throw .other("keepassxc-cli is not installed (apt-get install keepassxc)")
        }
        var args = ["export", "--format", "csv"]
        if let keyFile { args += ["--key-file", keyFile] }
        if noPassword { args.append("--no-password") }
        guard let (csv, status) = ImportInput.capture(cli, args + [database], limit: exportLimit) else {
            throw .other("cannot run keepassxc-cli")
        }
        defer { csv.wipe() }
        guard status == 0 else { throw .other("keepassxc-cli could not export \(database) (exit \(status.map(String.init) ?? "signal"))") }
        guard csv.count <= exportLimit else { throw .invalidRequest("the export is larger than \(exportLimit) bytes") }
        return try entries(csv, database: database)
    }

    static func entries(_ csv: SecureBytes, database: String) throws(KeyholdError) -> ImportSource {
        var source = ImportSource()
        var failure: KeyholdError?
        var withExtras = 0
        csv.withUnsafeBytes { raw in
            guard let rows = CSV.rows(raw), let header = rows.first else {
                failure = .other("keepassxc-cli's export is not the CSV it writes"); return
            }
            let names = header.map { CSV.text(raw, $0) ?? "" }
            func column(_ n: String) -> Int? { names.firstIndex(of: n) }
            guard let group = column("Group"), let title = column("Title"), let user = column("Username"),
                  let password = column("Password"), let url = column("URL") else {
                failure = .other("keepassxc-cli's export lacks the Group, Title, Username, Password or URL column"); return
            }
            let extras = ["Notes", "TOTP"].compactMap(column)
            for (index, row) in rows.enumerated().dropFirst() {
                let origin = "\(database) entry \(index)"
                guard row.count == header.count, let g = CSV.text(raw, row[group]), let t = CSV.text(raw, row[title]),
                      let u = CSV.text(raw, row[user]), let l = CSV.text(raw, row[url]) else {
                    source.unusable.append((origin, "a field is not text the vault can name an item with")); continue
                }
                // The recycle bin is the database's trash: not moved in.
                if g.split(separator: "/").dropFirst().first == "Recycle Bin" {
                    source.skipped.append(("\(origin) (\(Printable.escape(t, limit: 60)))", "in the recycle bin")); continue
                }
                if extras.contains(where: { !row[$0].isEmpty }) { withExtras += 1 }
                let account = u.isEmpty ? (t.isEmpty ? "-" : t) : u
                let secret = CSV.secret(raw, row[password])
                source.entries.append(ImportEntry(origin: "\(origin) (\(Printable.escape(t, limit: 60)))", service: prefix + g + "/" + t,
                                                  account: account, label: l, kind: .password, onePerService: false,
                                                  open: { () throws(KeyholdError) in
                    guard secret.count <= Limits.maxSecretBytes else { throw .invalidRequest("the password exceeds \(Limits.maxSecretBytes) bytes") }
                    return (account, secret.withUnsafeBytes { SecureBytes(copying: $0) })
                }))
            }
        }
        if let failure { throw failure }
        if withExtras > 0 {
            source.afterward = "\(withExtras) imported entries also have notes or a TOTP seed; those stay in the database only.\n"
        }
        return source
    }
}

/// RFC 4180 as keepassxc-cli writes it: fields in double quotes (`""` inside for a quote),
/// commas between, rows ending in LF or CRLF, newlines allowed inside quotes. A field is kept as
/// the range of its content, with whether it needs `""` undone.
enum CSV {
    struct Field {
        let range: Range<Int>
        let quoted: Bool
        var isEmpty: Bool { range.isEmpty }
    }

    static func rows(_ raw: UnsafeRawBufferPointer) -> [[Field]]? {
        var rows: [[Field]] = []
        var row: [Field] = []
        var i = 0
        while i < raw.count {
            if raw[i] == UInt8(ascii: "\"") {
                let start = i + 1
                i = start
                while true {
                    guard i < raw.count else { return nil }
                    if raw[i] == UInt8(ascii: "\"") {
                        if i + 1 < raw.count && raw[i + 1] == UInt8(ascii: "\"") { i += 2; continue }
                        break
                    }
                    i += 1
                }
                row.append(Field(range: start..<i, quoted: true))
                i += 1
            } else {
                let start = i
                while i < raw.count, ![UInt8(ascii: ","), 0x0a, 0x0d].contains(raw[i]) {
                    guard raw[i] != UInt8(ascii: "\"") else { return nil }
                    i += 1
                }
                row.append(Field(range: start..<i, quoted: false))
            }
            guard i < raw.count else { break }
            switch raw[i] {
            case UInt8(ascii: ","): i += 1; if i == raw.count { row.append(Field(range: i..<i, quoted: false)) }
            case 0x0d where i + 1 < raw.count && raw[i + 1] == 0x0a: i += 2; rows.append(row); row = []
            case 0x0a: i += 1; rows.append(row); row = []
            default: return nil
            }
        }
        if !row.isEmpty { rows.append(row) }
        return rows
    }

    /// The field's bytes with `""` undone, into `o` (as long as the range); their count.
    static func unquote(_ raw: UnsafeRawBufferPointer, _ f: Field, into o: UnsafeMutableRawBufferPointer) -> Int {
        var n = 0, i = f.range.lowerBound
        while i < f.range.upperBound {
            o[n] = raw[i]
            n += 1
            i += f.quoted && raw[i] == UInt8(ascii: "\"") ? 2 : 1
        }
        return n
    }

    static func text(_ raw: UnsafeRawBufferPointer, _ f: Field) -> String? {
        var out = [UInt8](repeating: 0, count: f.range.count)
        let n = out.withUnsafeMutableBytes { unquote(raw, f, into: $0) }
        return ImportInput.name(out[0..<n])
    }

    static func secret(_ raw: UnsafeRawBufferPointer, _ f: Field) -> SecureBytes {
        let out = SecureBytes(count: f.range.count)
        defer { out.wipe() }
        let n = out.withUnsafeMutableBytes { unquote(raw, f, into: $0) }
        return out.withUnsafeBytes { SecureBytes(copying: UnsafeRawBufferPointer(rebasing: $0[0..<n])) }
    }
}
