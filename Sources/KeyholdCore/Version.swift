/// Keyhold's one version number: what `--version` of every program prints and what the Debian
/// package is named after (`scripts/package.sh` reads it from this line).
public enum KeyholdVersion {
    public static let string = "0.9.0"
}

extension KeyholdVersion {
    /// What `PROGRAM --version` prints.
    public static func line(_ program: String) -> String { "\(program) \(string)\n" }

    /// The answer every program gives when its first argument is `--version`, or `--help` /
    /// `-h`: the text for standard output, after which it exits 0. Nil for anything else.
    public static func standardAnswer(_ arguments: [String], program: String, help: String) -> String? {
        switch arguments.first {
        case "--version": line(program)
        case "--help", "-h": help.hasSuffix("\n") ? help : help + "\n"
        default: nil
        }
    }
}
