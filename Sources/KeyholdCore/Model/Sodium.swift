import CSodium

/// libsodium must be initialised once before any other call; `sodium_init` is idempotent
/// and thread-safe, so every entry point that uses crypto calls `Sodium.ready()`.
public enum Sodium {
    private static let initialised: Bool = sodium_init() >= 0

    /// Traps if libsodium cannot initialise: no crypto may run without its RNG.
    public static func ready() {
        precondition(initialised, "libsodium failed to initialise")
    }
}
