/// Keyhold's one version number: what `--version` of every program prints and what the Debian
/// package is named after (`scripts/package.sh` reads it from this line).
public enum KeyholdVersion {
    public static let string = "0.9.0"
}
