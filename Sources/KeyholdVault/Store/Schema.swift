import KeyholdCore

/// The migrations in the root `schema.sql` (embedded at build time), split on `-- migrate:N`.
enum Schema {
    struct Migration { let version: Int64; let sql: String }

    static let migrations: [Migration] = parse(String(decoding: PackageResources.schema_sql, as: UTF8.self))

    /// The newest version this code knows.
    static var knownVersion: Int64 { migrations.last?.version ?? 0 }

    static func parse(_ text: String) -> [Migration] {
        var result: [Migration] = []
        var current: Int64?
        var lines: [Substring] = []
        func flush() {
            if let v = current { result.append(Migration(version: v, sql: lines.joined(separator: "\n"))) }
            lines.removeAll()
        }
        let marker = "-- migrate:"
        for line in text.split(separator: "\n", omittingEmptySubsequences: false) {
            if line.hasPrefix(marker) {
                flush()
                let number = line.dropFirst(marker.count).trimmingPrefix(while: { $0 == " " })
                guard let v = Int64(number.prefix(while: { $0.isNumber })) else {
                    preconditionFailure("schema.sql: bad migration marker")
                }
                precondition(v == (result.last?.version ?? 0) + 1, "schema.sql: migrations must be numbered 1, 2, 3, …")
                current = v
            } else if current != nil {
                lines.append(line)
            }
        }
        flush()
        return result
    }
}

private extension Substring {
    func trimmingPrefix(while predicate: (Character) -> Bool) -> Substring {
        var s = self
        while let c = s.first, predicate(c) { s = s.dropFirst() }
        return s
    }
}
