// The package under a real systemd: a minimal Debian 12 made by mmdebstrap (cached), booted
// with systemd-nspawn, the package installed with apt-get, and the broker, PAM stack, journal,
// restarts and the Secret Service agent's D-Bus activation exercised inside it.
import Foundation
import Glibc
import Testing
import KeyholdCore
import KeyholdTestSupport

/// A booted Debian 12 container: systemd-nspawn's child is its PID 1, commands run through
/// nsenter into all of its namespaces.
final class BootedDebian {
    /// Why the container cannot be made here, or nil.
    static let missing: String? = {
        if getuid() != 0 { return "needs root (systemd-nspawn, mmdebstrap)" }
        for tool in ["systemd-nspawn", "mmdebstrap", "nsenter"] where DebianPackage.which(tool) == nil {
            return "\(tool) is not installed (scripts/setup.sh installs systemd-container and mmdebstrap)"
        }
        return DebianPackage.missingTools
    }()

    /// What the root file system holds besides the package's own dependencies: systemd as PID 1,
    /// logind and a user session bus (lingering user manager), the password tools, secret-tool.
    static let basePackages = ["systemd", "systemd-sysv", "dbus", "dbus-user-session", "libpam-systemd",
                               "libpam-modules", "passwd", "libsecret-tools"]
    static let cacheDirectory = "/var/cache/keyhold-test"

    let root: String
    let nspawn: Process
    let leader: pid_t

    /// Boots a throwaway copy of the cached root file system (made first if needed).
    static func boot(packageDepends: [String]) async throws -> BootedDebian {
        try BootedDebian(cached: try await rootFileSystem(including: basePackages + packageDepends))
    }

    private init(cached: String) throws {
        root = "/var/tmp/kh-nspawn-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        let copy = runBounded(seconds: 300, "/bin/cp", ["-a", cached, root])
        guard copy.status == 0 else { throw PackageError(text: "cannot copy the root file system: \(copy.stderr)") }
        nspawn = Process()
        nspawn.executableURL = URL(fileURLWithPath: DebianPackage.which("systemd-nspawn")!)
        // --register=no, --keep-unit: no machined and no system bus on a host whose PID 1 is not systemd.
        nspawn.arguments = ["-q", "-D", root, "--register=no", "--keep-unit", "--boot"]
        let log = FileHandle(forWritingAtPath: "/dev/null")
        nspawn.standardInput = FileHandle(forReadingAtPath: "/dev/null")
        nspawn.standardOutput = log
        nspawn.standardError = log
        try nspawn.run()
        var found: pid_t = 0
        for _ in 0..<200 where found == 0 {   // 20 s at most
            found = Self.child(of: nspawn.processIdentifier) ?? 0
            if found == 0 { usleep(100_000) }
        }
        leader = found
        guard leader != 0 else { throw PackageError(text: "systemd-nspawn started no container") }
    }

    /// Runs `script` with /bin/sh inside the container, as root, for at most `seconds`.
    @discardableResult
    func run(_ script: String, seconds: Int = 60, stdin: [UInt8] = []) -> CommandResult {
        runBounded(seconds: seconds, DebianPackage.which("nsenter")!,
                   ["--target", String(leader), "--all", "--", "/bin/sh", "-c", script], stdin: stdin,
                   environment: ["PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C.UTF-8"])
    }

    /// Powers the container off (SIGTERM to nspawn), waits at most 30 s, then removes the copy.
    func shutDown() {
        if nspawn.isRunning {
            nspawn.terminate()
            for _ in 0..<300 where nspawn.isRunning { usleep(100_000) }
            if nspawn.isRunning { kill(nspawn.processIdentifier, SIGKILL); nspawn.waitUntilExit() }
        }
        runBounded(seconds: 300, "/bin/rm", ["-rf", "--one-file-system", root])
    }

    /// The mmdebstrap root file system with `packages`, cached by their list: made once (about
    /// a minute and a half, 200 MB, from the same Debian registry as apt-get), then reused.
    static func rootFileSystem(including packages: [String]) async throws -> String {
        let list = Array(Set(packages)).sorted()
        let key = String(list.joined(separator: ",").utf8.reduce(UInt64(14695981039346656037)) { ($0 ^ UInt64($1)) &* 1099511628211 }, radix: 16)
        let path = "\(cacheDirectory)/bookworm-\(key)"
        if access(path + "/usr/bin/systemctl", X_OK) == 0 { return path }
        try FileManager.default.createDirectory(atPath: cacheDirectory, withIntermediateDirectories: true)
        let partial = path + ".partial-\(getpid())"
        let r = await runAwaited(seconds: 1200, DebianPackage.which("mmdebstrap")!,
                                 ["--variant=minbase", "--include=" + list.joined(separator: ","), "bookworm", partial])
        guard r.status == 0 else {
            runBounded(seconds: 120, "/bin/rm", ["-rf", partial])
            throw PackageError(text: "mmdebstrap failed (\(r.status)): \(r.output.suffix(2000))")
        }
        guard rename(partial, path) == 0 else { throw PackageError(text: "cannot move \(partial) to \(path)") }
        return path
    }

    static func child(of parent: pid_t) -> pid_t? {
        guard let children = try? String(contentsOfFile: "/proc/\(parent)/task/\(parent)/children", encoding: .utf8) else { return nil }
        return children.split(separator: " ").first.flatMap { pid_t($0) }
    }
}

@Suite(.serialized, .enabled(if: BootedDebian.missing == nil, "cannot boot Debian 12 under systemd-nspawn: \(BootedDebian.missing ?? "")"),
       .timeLimit(.minutes(60)))
struct SystemdNspawnTests {
    static let user = "kh-user"
    static let password = "correct horse 42"
    static let secret = "nspawn-secret-7f3a"

    /// Everything in one boot (booting is the slow part): each step says what failed.
    @Test func thePackageUnderARealSystemd() async throws {
        let deb = try await DebianPackage.path()
        let depends = DebianPackage.names(inField: DebianPackage.field(deb, "Depends"))
        let debian = try await BootedDebian.boot(packageDepends: depends)
        defer { debian.shutDown() }
        // PID 1's bus appears a moment after nspawn starts it; then it waits for the boot to end.
        var state = "", why = ""
        for _ in 0..<60 where !["running", "degraded"].contains(state) {
            let r = debian.run("systemctl is-system-running --wait", seconds: 120)
            state = r.stdoutText.trimmingCharacters(in: .whitespacesAndNewlines)
            why = r.stderr
            if state.isEmpty { usleep(500_000) }
        }
        #expect(["running", "degraded"].contains(state), "the container did not finish booting: \(state) \(why)")
        #expect(copyProgram(deb, into: debian.root + "/root/keyhold.deb"))

        // apt-get installs it: the dependencies are in the root file system already.
        let install = debian.run("DEBIAN_FRONTEND=noninteractive apt-get install -y -q /root/keyhold.deb", seconds: 300)
        try #require(install.status == 0, "apt-get install: \(install.stdoutText.suffix(2000)) \(install.stderr)")
        #expect(debian.run("systemctl is-enabled keyholdd.service").stdoutText == "enabled\n")
        // Every installed program answers --version with the one version number, without a Swift toolchain.
        for program in ["keyhold", "keyholdd", "keyhold-secret-service", "git-credential-keyhold", "docker-credential-keyhold"] {
            let v = debian.run("\(program) --version")
            #expect(v.status == 0 && v.stdoutText.contains(KeyholdVersion.string), "\(program) --version: \(v.stdoutText) \(v.stderr)")
        }
        try #require(waitFor(debian, "systemctl is-active keyholdd.service", equals: "active"),
                     "keyholdd.service is not running: \(debian.run("systemctl status keyholdd --no-pager; journalctl -u keyholdd --no-pager -q").stdoutText)")
        // The unit running is the shipped one, whole: no drop-in weakens it.
        let cat = debian.run("systemctl cat keyholdd.service").stdoutText
        #expect(!cat.contains(".service.d/"), "a drop-in changes the unit: \(cat)")
        #expect(cat.contains("SystemCallFilter=@system-service") && cat.contains("ProtectSystem=strict"))
        let firstPID = debian.run("systemctl show -P MainPID keyholdd").stdoutText

        passwordItemThroughTheInstalledPAMStack(debian)
        credentialHelpersRunWithoutAToolchain(debian)
        auditLinesReachTheJournal(debian)
        restartLosesNoAcknowledgedWrite(debian)
        secretServiceByDBusActivation(debian)
        sandboxExposure(debian)

        // It stayed up: no crash, no restart but the two the test asked for.
        #expect(debian.run("systemctl show -P NRestarts keyholdd").stdoutText == "0\n")
        #expect(debian.run("systemctl show -P MainPID keyholdd").stdoutText != firstPID)
        #expect(debian.run("systemctl is-active keyholdd").stdoutText == "active\n")

        removalKeepsTheVaultAndChangedPAMFiles(debian)
    }

    /// A user with a password stores a device-passcode item and reads it through the package's
    /// /etc/pam.d/keyhold-passcode (pam_unix), the password from KEYHOLD_ASKPASS; a wrong
    /// password is refused (exit 6); an --allow-exe item is released to the allowed program.
    func passwordItemThroughTheInstalledPAMStack(_ debian: BootedDebian) {
        let u = Self.user
        // Two askpass programs, written straight into the container's file system.
        for (name, answer) in [("kh-askpass", Self.password), ("kh-wrong", "wrong password")] {
            let path = debian.root + "/usr/local/bin/" + name
            #expect(FileManager.default.createFile(atPath: path, contents: Data("#!/bin/sh\necho '\(answer)'\n".utf8)))
            chmod(path, 0o755)
        }
        let setup = debian.run("useradd -m -s /bin/sh \(u) && chpasswd", stdin: Array("\(u):\(Self.password)\n".utf8))
        #expect(setup.status == 0, "cannot make the user: \(setup.stderr)")
        let put = debian.run("runuser -u \(u) -- keyhold put example.org \(u) --policy device-passcode", stdin: Array(Self.secret.utf8))
        #expect(put.status == 0, "put: \(put.stderr)")
        let get = debian.run("runuser -u \(u) -- env KEYHOLD_ASKPASS=/usr/local/bin/kh-askpass keyhold get example.org \(u) --reason nspawn </dev/null")
        #expect(get.status == 0, "get with the password: \(get.stderr)")
        expectSecret(get.stdoutText, equals: Self.secret)
        let wrong = debian.run("runuser -u \(u) -- env KEYHOLD_ASKPASS=/usr/local/bin/kh-wrong keyhold get example.org \(u) </dev/null")
        #expect(wrong.status == Int32(Outcome.authenticationFailed.rawValue), "a wrong password: exit \(wrong.status) \(wrong.stderr)")
        #expect(wrong.stdout.isEmpty)
        // --allow-exe needs the broker to see who holds the connection (sock_diag, /proc/PID/fd):
        // the sandbox options that hid it (PrivateNetwork=yes) refused every such item.
        let allowed = debian.run("printf x | runuser -u \(u) -- keyhold put allowed.example \(u) --allow-exe /usr/bin/keyhold && runuser -u \(u) -- keyhold get allowed.example \(u)")
        #expect(allowed.status == 0 && allowed.stdoutText == "x", "an --allow-exe item: \(allowed.stderr)")
    }

    /// git's and docker's helpers, static executables, store and read a credential in a root
    /// file system that has no Swift (nor git, nor docker): the protocols driven by hand.
    func credentialHelpersRunWithoutAToolchain(_ debian: BootedDebian) {
        let asUser = "runuser -u \(Self.user) -- env KEYHOLD_ASKPASS=/usr/local/bin/kh-askpass"
        let gitStore = debian.run("\(asUser) git-credential-keyhold store",
                                  stdin: Array("protocol=https\nhost=git.example\nusername=ann\npassword=git-pw-1\n\n".utf8))
        #expect(gitStore.status == 0, "git-credential-keyhold store: \(gitStore.stderr)")
        let gitGet = debian.run("\(asUser) git-credential-keyhold get", stdin: Array("protocol=https\nhost=git.example\n\n".utf8))
        #expect(gitGet.status == 0 && gitGet.stdoutText.contains("password=git-pw-1\n"), "git-credential-keyhold get: \(gitGet.stderr)")
        let dockerStore = debian.run("\(asUser) docker-credential-keyhold store",
                                     stdin: Array(#"{"ServerURL":"https://registry.example","Username":"ann","Secret":"docker-pw-1"}"#.utf8))
        #expect(dockerStore.status == 0, "docker-credential-keyhold store: \(dockerStore.stderr)")
        let dockerGet = debian.run("\(asUser) docker-credential-keyhold get", stdin: Array("https://registry.example\n".utf8))
        #expect(dockerGet.status == 0 && dockerGet.stdoutText.contains("docker-pw-1"), "docker-credential-keyhold get: \(dockerGet.stderr)")
    }

    /// The broker's audit copies reach the journal (through /dev/log), naming the operation,
    /// the decision and the method, and never the secret or the password.
    func auditLinesReachTheJournal(_ debian: BootedDebian) {
        let journal = debian.run("journalctl -u keyholdd.service --no-pager -q -o cat").stdoutText
        #expect(journal.contains("audit op=put decision=granted outcome=ok"), "no put audit line in the journal")
        #expect(journal.contains("audit op=get decision=granted outcome=ok method=password"), "no password get in the journal")
        #expect(journal.contains("audit op=get decision=denied outcome=authentication-failed"), "no denied get in the journal")
        let everything = debian.run("journalctl --no-pager -q -o cat").stdoutText
        #expect(!everything.contains(Self.secret) && !everything.contains(Self.password), "a secret reached the journal")
    }

    /// `systemctl restart keyholdd` twice while the user writes items one after another: every
    /// write the CLI acknowledged (exit 0) reads back with its value afterwards.
    func restartLosesNoAcknowledgedWrite(_ debian: BootedDebian) {
        let u = Self.user
        let writer = """
            rm -f /tmp/acked; i=0
            while [ $i -lt 300 ]; do i=$((i+1))
              if printf 'value-%d' $i | runuser -u \(u) -- keyhold put load.example w$i 2>/dev/null; then echo $i >> /tmp/acked; fi
            done
            """
        let restarter = """
            n() { [ -f /tmp/acked ] && wc -l < /tmp/acked || echo 0; }
            for goal in 40 140; do
              t=0; while [ "$(n)" -lt $goal ] && [ $t -lt 1200 ]; do sleep 0.05; t=$((t+1)); done
              systemctl restart keyholdd.service
            done
            """
        let result = debian.run("(\(writer)) & w=$!; (\(restarter)); wait $w", seconds: 600)
        #expect(result.status == 0, "the write stream: \(result.stderr)")
        let check = debian.run("""
            bad=0; for i in $(cat /tmp/acked); do
              v=$(runuser -u \(u) -- keyhold get load.example w$i --no-interaction) || { echo "w$i unreadable"; bad=1; continue; }
              [ "$v" = "value-$i" ] || { echo "w$i differs"; bad=1; }
            done; echo "acked $(wc -l < /tmp/acked)"; exit $bad
            """, seconds: 600)
        #expect(check.status == 0, "an acknowledged write was lost: \(check.stdoutText)")
        let acked = Int(check.stdoutText.split(separator: "\n").last?.split(separator: " ").last ?? "") ?? 0
        #expect(acked >= 150, "too few writes were acknowledged around the restarts: \(acked)")
        let restarts = debian.run("journalctl -u keyholdd --no-pager -q -o cat | grep -c 'signal 15: shutting down'").stdoutText
        #expect(restarts == "2\n", "the broker was not restarted twice: \(restarts)")
        #expect(waitFor(debian, "systemctl is-active keyholdd.service", equals: "active"))
        #expect(debian.run("keyhold audit verify").status == 0, "the audit chain does not verify after the restarts")
    }

    /// A lingering user manager gives the user a session bus; secret-tool's first call starts
    /// the agent through the package's D-Bus activation file and user unit.
    func secretServiceByDBusActivation(_ debian: BootedDebian) {
        let u = Self.user
        let uid = debian.run("id -u \(u)").stdoutText.trimmingCharacters(in: .whitespacesAndNewlines)
        let env = "env XDG_RUNTIME_DIR=/run/user/\(uid) DBUS_SESSION_BUS_ADDRESS=unix:path=/run/user/\(uid)/bus"
        #expect(debian.run("loginctl enable-linger \(u)").status == 0)
        #expect(waitFor(debian, "test -S /run/user/\(uid)/bus && echo up", equals: "up"), "no session bus for \(u)")
        #expect(debian.run("runuser -u \(u) -- \(env) systemctl --user is-active keyhold-secret-service").stdoutText != "active\n")
        let store = debian.run("runuser -u \(u) -- \(env) secret-tool store --label=nspawn service ss.example account \(u)",
                               seconds: 60, stdin: Array("ss-value-9".utf8))
        #expect(store.status == 0, "secret-tool store: \(store.stderr)")
        let lookup = debian.run("runuser -u \(u) -- \(env) secret-tool lookup service ss.example account \(u)", seconds: 60)
        #expect(lookup.status == 0 && lookup.stdoutText == "ss-value-9", "secret-tool lookup: \(lookup.status) \(lookup.stderr)")
        #expect(debian.run("runuser -u \(u) -- \(env) systemctl --user is-active keyhold-secret-service").stdoutText == "active\n",
                "the agent was not started by D-Bus activation as the user unit")
        let journal = debian.run("journalctl -u keyholdd.service --no-pager -q -o cat").stdoutText
        #expect(journal.contains("exe=/usr/bin/keyhold-secret-service"), "the broker saw no request from the agent")
    }

    /// systemd's own exposure score: at most 2.2, the figure of the unit analysed offline
    /// before it ever ran (lower is better).
    func sandboxExposure(_ debian: BootedDebian) {
        let r = debian.run("systemd-analyze security keyholdd.service --no-pager")
        let line = r.stdoutText.split(separator: "\n").last { $0.contains("Overall exposure level") } ?? ""
        let score = line.split(separator: ":").last?.split(separator: " ").first.flatMap { Double($0) }
        #expect(score != nil && score! <= 2.2, "systemd-analyze security: \(line)")
        print("systemd-analyze security keyholdd.service: \(line.trimmingCharacters(in: .whitespaces))")
    }

    /// A changed PAM file survives a reinstall (a conffile); removal stops the broker and
    /// keeps /var/lib/keyhold; purge keeps it too and says so.
    func removalKeepsTheVaultAndChangedPAMFiles(_ debian: BootedDebian) {
        #expect(debian.run("echo '# changed by the administrator' >> /etc/pam.d/keyhold-passcode").status == 0)
        let again = debian.run("DEBIAN_FRONTEND=noninteractive apt-get install -y -q --reinstall /root/keyhold.deb", seconds: 300)
        #expect(again.status == 0, "reinstall: \(again.stderr)")
        #expect(debian.run("tail -1 /etc/pam.d/keyhold-passcode").stdoutText == "# changed by the administrator\n",
                "the reinstall replaced a changed PAM file")
        let remove = debian.run("DEBIAN_FRONTEND=noninteractive apt-get remove -y -q keyhold", seconds: 300)
        #expect(remove.status == 0, "remove: \(remove.stderr)")
        #expect(debian.run("systemctl is-active keyholdd.service").stdoutText != "active\n")
        #expect(debian.run("ls /var/lib/keyhold | grep -q .").status == 0, "removal deleted the vault")
        let purge = debian.run("DEBIAN_FRONTEND=noninteractive apt-get purge -y -q keyhold", seconds: 300)
        #expect(purge.status == 0, "purge: \(purge.stderr)")
        #expect((purge.stdoutText + purge.stderr).contains("purge keeps the vault in /var/lib/keyhold"), "purge did not say what it does")
        #expect(debian.run("ls /var/lib/keyhold | grep -q .").status == 0, "purge deleted the vault")
        #expect(debian.run("test -e /etc/pam.d/keyhold-passcode").status != 0, "purge left the PAM conffile")
    }

    /// Polls `command` (0.2 s apart, 30 s at most) until its output is `expected`.
    func waitFor(_ debian: BootedDebian, _ command: String, equals expected: String) -> Bool {
        for _ in 0..<150 {
            if debian.run(command, seconds: 20).stdoutText.trimmingCharacters(in: .whitespacesAndNewlines) == expected { return true }
            usleep(200_000)
        }
        return false
    }

    func copyProgram(_ source: String, into destination: String) -> Bool {
        (try? KeyholdTestSupport.copyProgram(source, to: destination)) != nil
    }
}
