import KeyholdCore
import KeyholdProtocol

extension Vault {
    /// Root only: the broker writes a backup of the whole vault to `path` (absolute; created
    /// 0600, never replacing a file) and answers with its size in bytes. Refused when the
    /// vault has no recovery key (`keyholdd --create-recovery-key`).
    public func backup(to path: String) throws(KeyholdError) -> UInt64 {
        var r = Request(.backup)
        r.label = path
        return try perform(r, interaction: nil).count ?? 0
    }
}
