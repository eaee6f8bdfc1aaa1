import CKeyholdOS
import Glibc
import KeyholdClient
import KeyholdCore

/// `keyhold export FILE [--recipient AGE_RECIPIENT]`: moving out. Each of the caller's items is
/// released exactly as `get` releases it (its policy, prompts, `--allow-exe`; audited as a
/// release with the reason `export`) and written as one JSON line. FILE is created, never
/// replaced (O_EXCL, mode 0600); with a recipient the lines go through a pipe into `age -r
/// RECIPIENT`, whose output is FILE, so no clear copy touches the disk. An item that cannot be
/// released without a prompt under `--no-interaction`, or that `--allow-exe` keeps from
/// keyhold, is skipped; one that fails otherwise is counted failed (exit 1). Device-only items
/// (issue 39 item 4) are not in the vault's model yet: once they are, they are left out here.
enum ExportCommand {
    static let spec = CommandSpec("export", positionals: ["FILE"], options: [
        OptionSpec("--recipient", value: "AGE_RECIPIENT", help: "encrypt FILE to this age recipient (age1…, or an ssh public key)"),
        OptionSpec("--no-interaction", help: "skip items that would need a prompt, rather than prompt"),
        OptionSpec("--reason", value: "TEXT", help: "why (shown at each prompt and audited; default 'export')"),
    ], summary: """
        Writes your items, secrets included, to a new file (or through age).
        One JSON line per item (service, account, label, kind, policy, reuse_seconds,
        allowed_executables, expires, secret in base64); FILE is created 0600 and never
        replaced. Each item is released under its policy, as by get, and audited.
        """)

    static func run(_ vault: Vault, _ c: ParsedCommand) throws(KeyholdError) -> Int32 {
        let path = c.positionals[0]
        var age: String?
        if c.value("--recipient") != nil {
            guard let found = RotateCommand.resolve("age") else { throw .other("age is not installed (apt-get install age)") }
            age = found
        }
        let items = try vault.items()
        let fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw .other("cannot create \(path): \(String(cString: strerror(errno))) (export never replaces a file)") }
        fchmod(fd, 0o600)  // whatever the umask
        var sink = fd
        var agePid: pid_t?
        if let age, let recipient = c.value("--recipient") {
            var p: [Int32] = [-1, -1]
            guard ckh_pipe_cloexec(&p) == 0, let pid = Subprocess.spawn(age, ["--encrypt", "--recipient", recipient], stdinFD: p[0], stdoutFD: fd) else {
                close(fd); unlink(path)
                throw .other("cannot run age")
            }
            close(p[0])
            sink = p[1]
            agePid = pid
        }
        signal(SIGPIPE, SIG_IGN)  // age exiting early (a bad recipient) must not kill us mid-write
        let interaction = c.flag("--no-interaction") ? nil : PromptInteraction()
        var exported = 0, skipped = 0, failed = 0
        var writeFailed = false
        for item in items where !writeFailed {
            let released: ReleasedSecret
            do throws(KeyholdError) {
                released = try BusyBroker.waiting({}) { () throws(KeyholdError) in
                    try vault.release(service: item.service, account: item.account, reason: c.value("--reason") ?? "export",
                                      interaction: interaction)
                }
            } catch {
                switch error {
                case .interactionNotAllowed, .notAuthorized, .userCanceled:
                    skipped += 1
                case .brokerUnavailable, .auditUnavailable:
                    close(sink); _ = agePid.map(Subprocess.wait); if sink != fd { close(fd) }
                    unlink(path)
                    throw error
                default:
                    failed += 1
                }
                Output.err("export: \(item.service) / \(item.account): \(error.description)")
                continue
            }
            defer { released.secret.wipe() }
            let line = JSON.object([
                ("service", .string(item.service)), ("account", .string(item.account)), ("label", .string(item.label)),
                ("kind", .string(item.kind.name)), ("policy", .string(item.policy)),
                ("reuse_seconds", .number(Int64(item.reuseSeconds))),
                ("allowed_executables", .array(item.allowedExecutables.map { .string($0) })),
                ("expires", released.expires.map { .string(Time.iso8601($0)) } ?? .null),
                ("secret", .string(Output.base64(released.secret))),
            ]) + "\n"
            if DescriptorIO.writeAll(sink, line) != 0 { writeFailed = true } else { exported += 1 }
        }
        close(sink)
        var ok = !writeFailed
        if let agePid { ok = Subprocess.wait(agePid) == 0 && ok }
        if sink != fd { close(fd) }
        guard ok else {
            unlink(path)  // a partial export is no export
            throw .other(agePid != nil ? "age failed (see its message above); \(path) removed" : "cannot write \(path); it was removed")
        }
        Output.out("exported \(exported), skipped \(skipped), failed \(failed)\n")
        return failed == 0 ? 0 : Int32(Outcome.otherError.rawValue)
    }
}
