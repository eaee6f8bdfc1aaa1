import Glibc
import KeyholdClient
import KeyholdCore

/// `keyhold backup FILE` (issue 39 item 2): the broker writes a consistent snapshot of the
/// vault, opened only with the recovery key, to FILE. Root only; the broker creates the file
/// itself (0600, O_EXCL, no symlink followed), so the path is made absolute here.
enum BackupCommand {
    static let spec = CommandSpec("backup", positionals: ["FILE"], summary: """
        Root only: writes a backup of the whole vault (sealed items, audit chain, and the
        vault key wrapped under the recovery key) to a new file FILE, 0600. Restore it with
        keyholdd --restore FILE and the recovery key; without that key it opens nothing.
        """)

    static func run(_ vault: Vault, _ c: ParsedCommand) throws(KeyholdError) -> Int32 {
        var path = c.positionals[0]
        if !path.hasPrefix("/") {
            var buf = [CChar](repeating: 0, count: Int(PATH_MAX))
            guard getcwd(&buf, buf.count) != nil else { throw .other("cannot resolve the current directory") }
            path = String(cString: buf) + "/" + path
        }
        let bytes = try vault.backup(to: path)
        Output.err("wrote a backup of \(bytes) bytes to \(path); it opens only with the recovery key")
        return 0
    }
}
