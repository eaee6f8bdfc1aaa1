import Glibc
import KeyholdCore

/// An application password turned into its Argon2id key *before* the store is locked.
///
/// Deriving costs about half a second and 256 MiB (MODERATE); done inside the store's lock it
/// would stall every other caller's request for that long. So the broker derives it first and
/// hands the store this: the key together with the parameters (salt, limits) it was made for.
public struct AppPasswordKey: Sendable {
    let parameters: PasswordHashParameters
    let key: PasswordKey

    /// The key that opens `item`: its stored (authenticated) salt and limits.
    public static func opening(_ item: StoredItem, password: SecureBytes) throws(StoreError) -> AppPasswordKey {
        guard let parameters = item.passwordHashing else { throw .invalidItem }
        try checkShape(password)
        // The parameters were authenticated with the item, so a failure here is damage.
        do { return AppPasswordKey(parameters: parameters, key: try PasswordKey.derive(password: password, parameters: parameters)) }
        catch { throw .integrity }
    }

    /// A key for sealing a secret under `password`, with a fresh salt.
    public static func sealing(password: SecureBytes, strength: PasswordHashStrength) throws(StoreError) -> AppPasswordKey {
        try checkShape(password)
        let parameters = PasswordHashParameters.generate(strength)
        do { return AppPasswordKey(parameters: parameters, key: try PasswordKey.derive(password: password, parameters: parameters)) }
        catch { throw .io(code: ENOMEM) }  // Argon2id could not get its memory
    }

    /// Zeroes the key once it has done its work (it is freed zeroed as well).
    public func wipe() { key.keyBytes.bytes.wipe() }

    /// Not empty (a password that protects nothing) and no longer than any text the vault keeps.
    private static func checkShape(_ password: SecureBytes) throws(StoreError) {
        guard password.count <= Limits.maxTextBytes else { throw .tooLarge }
        guard password.count > 0 else { throw .invalidItem }
    }
}
