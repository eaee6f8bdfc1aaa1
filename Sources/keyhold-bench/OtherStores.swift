import Glibc
import KeyholdCore

/// Other secret stores the CLI is compared with, when installed and usable on this machine.
/// Each is set up with one bench item first; a store that cannot be set up is skipped with
/// the reason printed, never measured failing.
enum OtherStores {
    typealias Command = (path: String, args: () -> [String], env: [String]?)

    /// `secret-tool lookup` against the Secret Service of the session bus; without a session bus
    /// (as under CI or ssh), against a gnome-keyring the benchmark starts on a private bus of its
    /// own when `dbus-daemon` and `gnome-keyring-daemon` are installed. `stop` ends what it started.
    static func secretTool(in dir: String) -> (command: Command, stop: () -> Void)? {
        guard let tool = installed("secret-tool") else { print("secret-tool: not installed; skipped"); return nil }
        let lookup = ["lookup", "service", "bench.example", "account", "user-1"]
        if getenv("DBUS_SESSION_BUS_ADDRESS") == nil {
            guard let started = PrivateKeyring.start(in: dir + "/keyring", lookup: [tool] + lookup) else { return nil }
            return ((tool, { lookup }, started.environment), started.stop)
        }
        guard run(tool, ["store", "--label=keyhold bench", "service", "bench.example", "account", "user-1"],
                  stdin: Array("bench-value".utf8)) == 0,
              run(tool, lookup) == 0 else {
            print("secret-tool: no Secret Service answered on the session bus; skipped")
            return nil
        }
        return ((tool, { lookup }, nil), {})
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

/// A session bus and a gnome-keyring of the benchmark's own, holding the one bench item, for
/// `secret-tool lookup` where no session bus exists. The keyring is written in gnome-keyring's
/// unencrypted textual format (no unlock prompt on a machine without a person): the fastest
/// gnome-keyring can answer, so a lower bound for it.
enum PrivateKeyring {
    /// `lookup`: the secret-tool command line that must find the bench item once it is up.
    static func start(in dir: String, lookup: [String]) -> (environment: [String], stop: () -> Void)? {
        guard let busDaemon = installed("dbus-daemon"), let keyring = installed("gnome-keyring-daemon") else {
            print("secret-tool: installed, but no session bus and no dbus-daemon / gnome-keyring-daemon to start one; skipped")
            return nil
        }
        let keyrings = dir + "/.local/share/keyrings"
        for d in [dir, dir + "/run", dir + "/.local", dir + "/.local/share", keyrings] { mkdir(d, 0o700) }
        let config = """
            <!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN" \
            "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
            <busconfig><type>session</type><listen>unix:path=\(dir)/bus</listen>
            <policy context="default"><allow send_destination="*" eavesdrop="true"/><allow eavesdrop="true"/><allow own="*"/>\
            </policy></busconfig>
            """
        let file = """
            [keyring]
            display-name=login
            ctime=0
            mtime=0
            lock-on-idle=false
            lock-after=false

            [1]
            item-type=0
            display-name=keyhold bench
            secret=bench-value
            mtime=0
            ctime=0

            [1:attribute0]
            name=account
            type=string
            value=user-1

            [1:attribute1]
            name=service
            type=string
            value=bench.example

            """
        guard write(config, to: dir + "/bus.conf"), write("login", to: keyrings + "/default"),
              write(file, to: keyrings + "/login.keyring") else {
            print("secret-tool: cannot write a private keyring; skipped")
            return nil
        }
        let environment = ["PATH=/usr/bin:/bin", "HOME=" + dir, "XDG_RUNTIME_DIR=" + dir + "/run",
                           "DBUS_SESSION_BUS_ADDRESS=unix:path=" + dir + "/bus"]
        var daemons: [pid_t] = []
        guard let bus = spawnDaemon(busDaemon, ["--config-file=" + dir + "/bus.conf", "--nofork", "--nopidfile"], environment: environment) else {
            print("secret-tool: cannot start a private session bus; skipped")
            return nil
        }
        daemons.append(bus)
        for _ in 0..<100 where access(dir + "/bus", F_OK) != 0 { usleep(20_000) }
        guard let keyringDaemon = spawnDaemon(keyring, ["--foreground", "--components=secrets"], environment: environment) else {
            stopAll(daemons)
            print("secret-tool: cannot start gnome-keyring-daemon; skipped")
            return nil
        }
        daemons.append(keyringDaemon)
        // Until it answers for the item (it loads the file at start), each try under a time limit:
        // a bus or keyring that never answers is skipped, not waited for.
        let probe = ["5"] + lookup
        var answered = false
        for _ in 0..<50 where !answered {
            answered = run("/usr/bin/timeout", probe, environment: environment) == 0
            if !answered { usleep(100_000) }
        }
        guard answered else {
            stopAll(daemons)
            print("secret-tool: the private gnome-keyring did not answer; skipped")
            return nil
        }
        print("secret-tool: no session bus; measured against gnome-keyring on a private bus (an unencrypted keyring)")
        return (environment, { [daemons] in stopAll(daemons) })
    }

    /// Ends the daemons started, newest first, and reaps them.
    private static func stopAll(_ daemons: [pid_t]) {
        for pid in daemons.reversed() {
            kill(pid, SIGTERM)
            var status: Int32 = 0
            while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
        }
    }

    private static func write(_ text: String, to path: String) -> Bool {
        let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        return DescriptorIO.writeAll(fd, text) == 0
    }
}
