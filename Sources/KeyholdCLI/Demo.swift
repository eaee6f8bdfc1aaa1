import Glibc
import KeyholdClient
import KeyholdCore

/// `keyhold demo`: a real broker on a temporary vault with a demo-only PAM stack (pam_matrix
/// with a demo password, so no real account is touched): put → gated get → ls → audit.
enum Demo {
    static let demoPassword = "keyhold-demo"

    /// pam_matrix.so from libpam-wrapper, in /usr/lib/<multiarch>/pam_wrapper/ on any Debian
    /// architecture (outside libpam's module directory, so it is named by its full path).
    static func findPAMMatrix() -> String? {
        guard let d = opendir("/usr/lib") else { return nil }
        defer { closedir(d) }
        var candidates = ["/usr/lib/pam_wrapper/pam_matrix.so"]
        while let e = readdir(d) {
            let name = withUnsafeBytes(of: e.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            if !name.hasPrefix(".") { candidates.append("/usr/lib/\(name)/pam_wrapper/pam_matrix.so") }
        }
        return candidates.sorted().first { access($0, R_OK) == 0 }
    }

    static func run(nonInteractive: Bool) -> Int32 {
        guard let pamMatrix = findPAMMatrix() else {
            Output.err("the demo needs pam_matrix from Debian's libpam-wrapper package (apt-get install libpam-wrapper)")
            return 1
        }
        guard let broker = brokerExecutable() else {
            Output.err("cannot find keyholdd next to keyhold")
            return 1
        }
        var template = Array("/tmp/keyhold-demo-XXXXXX".utf8CString)
        guard let dirPtr = mkdtemp(&template) else {
            Output.err("cannot create a temporary directory")
            return 1
        }
        let dir = String(cString: dirPtr)
        defer { _ = Subprocess.spawn("/bin/rm", ["-rf", dir]).flatMap(Subprocess.wait) }
        let user = currentUserName() ?? "root"
        mkdir("\(dir)/pam", 0o700)
        guard writeFile("\(dir)/passdb", "\(user):\(demoPassword):keyhold-passcode\n"),
              writeFile("\(dir)/pam/keyhold-passcode", """
                # Demo only: the account password is replaced by pam_matrix and a demo password.
                auth     required \(pamMatrix) passdb=\(dir)/passdb
                account  required pam_permit.so

                """),
              writeFile("\(dir)/pam/other", "auth required pam_deny.so\naccount required pam_deny.so\n"),
              writeFile("\(dir)/askpass", "#!/bin/sh\n# Demo askpass: answers the demo prompt.\necho '\(demoPassword)'\n", mode: 0o700)
        else {
            Output.err("cannot write the demo's files in \(dir)")
            return 1
        }
        let socket = "\(dir)/keyhold.sock"
        let log = open("\(dir)/broker.log", O_WRONLY | O_CREAT | O_CLOEXEC, 0o600)
        defer { close(log) }
        guard let pid = Subprocess.spawn(broker, ["--state-dir", "\(dir)/state", "--socket", socket, "--pam-dir", "\(dir)/pam",
                                                  "--fprint-state-dir", "\(dir)/no-prints",
                                                  // A throwaway vault must not take a counter in a real TPM.
                                                  "--key-protector", "file"], stderrFD: log) else {
            Output.err("cannot start keyholdd")
            return 1
        }
        defer {
            kill(pid, SIGTERM)
            _ = Subprocess.wait(pid)
        }
        let vault = Vault(socketPath: socket)
        var ready = false
        for _ in 0..<200 {
            if (try? vault.items()) != nil { ready = true; break }
            usleep(25_000)
        }
        guard ready else {
            Output.err("the demo broker did not start")
            return 1
        }
        Output.out("""
            Keyhold demo — broker pid \(pid), vault \(dir)/state (temporary)
            The demo's PAM stack checks a demo password instead of your account's: \(demoPassword)

            """)
        do throws(KeyholdError) {
            let token = SecureBytes.random(count: 24)
            let hex = SecureBytes(count: 48)
            hex.withUnsafeMutableBytes { out in token.withUnsafeBytes { Hex.encode($0, into: out) } }
            try vault.add(hex, service: "oauth.example.com", account: user, label: "demo refresh token", kind: .refreshToken,
                          access: AccessControl(policy: Policy(constraints: [.devicePasscode])))
            Output.out("1. put    oauth.example.com / \(user): a \(hex.count)-byte refresh token, policy device-passcode\n")
            Output.out("2. state  \(try vault.state(service: "oauth.example.com", account: user).rawValue)\n")

            if nonInteractive || Terminal.open() == nil { setenv("KEYHOLD_ASKPASS", "\(dir)/askpass", 1) }
            guard let interaction = PromptInteraction() else { throw .interactionNotAllowed }
            Output.out("3. get    (the broker runs PAM; answer with the demo password)\n")
            let back = try vault.secret(service: "oauth.example.com", account: user, reason: "keyhold demo", interaction: interaction)
            Output.out("         released \(back.count) bytes, \(back.constantTimeEquals(hex) ? "identical to what was stored" : "DIFFERENT from what was stored")\n")
            let same = back.constantTimeEquals(hex)
            back.wipe()
            Output.out("4. ls\n")
            var rows = [["SERVICE", "ACCOUNT", "KIND", "POLICY", "LABEL"]]
            for i in try vault.items() { rows.append([i.service, i.account, i.kind.name, i.policy, i.label]) }
            Output.out(Output.table(rows).split(separator: "\n").map { "         " + $0 }.joined(separator: "\n") + "\n")
            Output.out("5. audit (entries this demo wrote)\n")
            var audit = [["SEQ", "OPERATION", "ITEM", "DECISION", "METHOD", "OUTCOME"]]
            try vault.auditEntries { entries in
                for e in entries {
                    let v = e.readable
                    audit.append([String(e.seq), v.operation, AuditCommands.item(v), v.decision, v.method, v.outcome])
                }
                return true
            }
            Output.out(Output.table(audit).split(separator: "\n").map { "         " + $0 }.joined(separator: "\n") + "\n")
            let verification = try vault.verifyAudit()
            Output.out("6. audit verify: \(verification.verified ? "chain intact, \(verification.count) entries" : "BROKEN")\n")
            Output.out("Demo done; the temporary vault is removed.\n")
            return same && verification.verified ? 0 : 1
        } catch {
            Output.err(error.description)
            return Int32(error.outcome.rawValue)
        }
    }

    static func brokerExecutable() -> String? {
        var buf = [CChar](repeating: 0, count: 4096)
        let n = readlink("/proc/self/exe", &buf, buf.count - 1)
        guard n > 0 else { return nil }
        var path = String(decoding: buf[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
        while let last = path.last, last != "/" { path.removeLast() }
        let candidate = path + "keyholdd"
        return access(candidate, X_OK) == 0 ? candidate : nil
    }

    static func currentUserName() -> String? {
        guard let pw = getpwuid(getuid()), let name = pw.pointee.pw_name else { return nil }
        return String(cString: name)
    }

    static func writeFile(_ path: String, _ text: String, mode: mode_t = 0o600) -> Bool {
        let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        Output.write(fd, text)
        return fchmod(fd, mode) == 0
    }
}
