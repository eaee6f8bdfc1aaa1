import Glibc

/// Other secret stores the CLI is compared with, when installed and usable on this machine.
/// Each is set up with one bench item first; a store that cannot be set up is skipped with
/// the reason printed, never measured failing.
enum OtherStores {
    typealias Command = (path: String, args: () -> [String], env: [String]?)

    /// `secret-tool lookup` against whatever Secret Service the session bus offers.
    static func secretTool(in dir: String) -> Command? {
        guard let tool = installed("secret-tool") else { print("secret-tool: not installed; skipped"); return nil }
        guard getenv("DBUS_SESSION_BUS_ADDRESS") != nil else {
            print("secret-tool: installed, but no session bus (DBUS_SESSION_BUS_ADDRESS unset); skipped")
            return nil
        }
        guard run(tool, ["store", "--label=keyhold bench", "service", "bench.example", "account", "user-1"],
                  stdin: Array("bench-value".utf8)) == 0,
              run(tool, ["lookup", "service", "bench.example", "account", "user-1"]) == 0 else {
            print("secret-tool: no Secret Service answered on the session bus; skipped")
            return nil
        }
        return (tool, { ["lookup", "service", "bench.example", "account", "user-1"] }, nil)
    }

    /// `pass show` with a throw-away GnuPG home and password store (a key without passphrase).
    static func pass(in dir: String) -> Command? {
        guard let pass = installed("pass"), let gpg = installed("gpg") else { print("pass: not installed; skipped"); return nil }
        let home = dir + "/gnupg", store = dir + "/password-store"
        mkdir(home, 0o700)
        let env = ["GNUPGHOME=" + home, "PASSWORD_STORE_DIR=" + store, "PATH=/usr/bin:/bin", "HOME=" + dir]
        guard run(gpg, ["--homedir", home, "--batch", "--passphrase", "", "--quick-gen-key", "bench@keyhold.invalid",
                        "default", "default", "never"]) == 0,
              run(pass, ["init", "bench@keyhold.invalid"], environment: env) == 0,
              run(pass, ["insert", "-e", "bench.example/user-1"], stdin: Array("bench-value\n".utf8), environment: env) == 0 else {
            print("pass: setting up a temporary store failed; skipped")
            return nil
        }
        return (pass, { ["show", "bench.example/user-1"] }, env)
    }
}
