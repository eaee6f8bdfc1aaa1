/// Hard limits, shared by client, protocol and store so each rejects the same input.
public enum Limits {
    /// Largest secret a vault item holds.
    public static let maxSecretBytes = 64 * 1024
    /// Largest service, account, label, reason or executable path.
    public static let maxTextBytes = 4096
    /// Longest reuse window, like `touchIDAuthenticationAllowableReuseDuration` (seconds).
    public static let maxReuseSeconds: UInt32 = 300
    /// Longest prompt answer or application password.
    public static let maxAnswerBytes = 4096
    /// Most allowed executables per item.
    public static let maxAllowedExecutables = 16
    /// Most attribute pairs in a Secret Service map or search (libsecret sets a handful).
    public static let maxAttributePairs = 64
}
