import Foundation
import Glibc

/// `git credential fill` through git-credential-keyhold, side by side in the same run with git's
/// plain `store` helper (a 0600 text file) and, where it is installed, git-credential-libsecret
/// (against whatever Secret Service is running). Each fill is a whole git process, as git
/// itself starts it for a push.
@MainActor func measureCredentialHelpers(samples: Int = 200) {
    let description = Array("protocol=https\nhost=bench.example\nusername=alice\n\n".utf8)
    let approve = Array("protocol=https\nhost=bench.example\nusername=alice\npassword=bench-pw\n\n".utf8)
    var cases: [(name: String, helper: String)] = [
        ("git-credential-keyhold", "keyhold"),
        ("git store helper (plaintext file)", "store --file \(dir)/git-credentials"),
    ]
    let libsecret = ["/usr/lib/git-core/git-credential-libsecret", "/usr/libexec/git-core/git-credential-libsecret",
                     "/usr/share/doc/git/contrib/credential/libsecret/git-credential-libsecret"]
        .first { FileManager.default.isExecutableFile(atPath: $0) }
    if let libsecret, getenv("DBUS_SESSION_BUS_ADDRESS") != nil { cases.append(("git-credential-libsecret", libsecret)) }

    var p50s: [String: Double] = [:]
    for c in cases {
        let home = dir + "/git-home-\(p50s.count)"
        mkdir(home, 0o700)
        try? "[credential]\n\thelper = \(c.helper)\n".write(toFile: home + "/.gitconfig", atomically: true, encoding: .utf8)
        let env = ["HOME=\(home)", "GIT_CONFIG_NOSYSTEM=1", "GIT_TERMINAL_PROMPT=0", "KEYHOLD_SOCKET=\(socketPath)",
                   "PATH=\(bin):/usr/bin:/bin"] + (getenv("DBUS_SESSION_BUS_ADDRESS").map { ["DBUS_SESSION_BUS_ADDRESS=\(String(cString: $0))"] } ?? [])
        guard spawnGit(["credential", "approve"], env: env, stdin: approve) == 0,
              spawnGit(["credential", "fill"], env: env, stdin: description) == 0 else {
            report("git credential fill via \(c.name)", "failed", "")
            continue
        }
        var times: [Double] = []
        for _ in 0..<samples {
            let t0 = now()
            _ = spawnGit(["credential", "fill"], env: env, stdin: description)
            times.append(now() - t0)
        }
        p50s[c.name] = percentile(times, 0.5)
        report("git credential fill via \(c.name): p50 / p99", "\(ms(percentile(times, 0.5))) / \(ms(percentile(times, 0.99)))", "")
    }
    if let k = p50s["git-credential-keyhold"] {
        for (name, p) in p50s where name != "git-credential-keyhold" {
            report("git credential fill p50 ratio, keyhold vs \(name)", String(format: "%.1fx", k / p), "")
        }
    }
    if libsecret == nil || getenv("DBUS_SESSION_BUS_ADDRESS") == nil {
        report("git credential fill via git-credential-libsecret", libsecret == nil ? "not installed" : "no session bus",
               "(not measured here: scripts/bench-secret-service.sh runs it against gnome-keyring)")
    }
}

/// git with an explicit environment; output discarded. Its exit status.
func spawnGit(_ arguments: [String], env: [String], stdin: [UInt8]) -> Int32 {
    (run("/usr/bin/git", arguments, stdin: stdin, environment: env) >> 8) & 0xff
}
