import Glibc
import KeyholdClient
import KeyholdCore

/// The `keyhold` command. `main` returns the exit code; it is the CLI contract of the README.
public enum KeyholdCommand {
    static let itemOptionsHelp = "SERVICE ACCOUNT name the item (e.g. github.com alice)"

    public static let parser = ArgumentParser(
        commands: [
            CommandSpec("put", positionals: ["SERVICE", "ACCOUNT"], options: [
                OptionSpec("--label", value: "TEXT", help: "a label shown by ls"),
                OptionSpec("--kind", value: "KIND", help: "refresh-token, password or generic (default)"),
                OptionSpec("--policy", value: "EXPR", help: "access control, e.g. 'biometry-current-set or device-passcode'"),
                OptionSpec("--reuse", value: "SECONDS", help: "release without a prompt this long after an authentication (0-300)"),
                OptionSpec("--allow-exe", value: "PATH", repeatable: true, help: "only this program may read the item"),
                OptionSpec("--update", help: "replace an existing item (its current policy must be satisfied)"),
                OptionSpec("--if-generation", value: "G", help: "with --update: only if the item is still at generation G (else exit 14)"),
                OptionSpec("--expires", value: "TIME", help: "when the secret expires (TIME as for audit --since); state says expired after"),
            ], summary: """
                Stores a secret read from standard input, exactly as given (from a terminal: asked
                twice without echo, newline stripped). Never from the command line. Policies:
                none, user-presence, biometry-any, biometry-current-set, device-passcode, joined
                by one of 'or' / 'and', optionally followed by +app-password.
                """),
            CommandSpec("get", positionals: ["SERVICE", "ACCOUNT"], options: [
                OptionSpec("--reason", value: "TEXT", help: "why the secret is needed (shown and audited)"),
                OptionSpec("--no-interaction", help: "fail with exit 7 rather than prompt"),
                OptionSpec("--json", help: "one JSON object: secret (base64), generation, expires"),
            ], summary: "Writes the item's secret, exactly as stored, to standard output."),
            RotateCommand.spec,
            CommandSpec("rm", positionals: ["SERVICE", "ACCOUNT"], options: [
                OptionSpec("--reason", value: "TEXT", help: "why the item is removed (shown and audited)"),
                OptionSpec("--no-interaction", help: "fail with exit 7 rather than prompt"),
            ], summary: "Removes an item, after its policy is satisfied (a damaged or invalidated item: after your password)."),
            CommandSpec("ls", options: [OptionSpec("--json", help: "one JSON object per line")],
                        summary: "Lists your items' metadata (never a secret)."),
            CommandSpec("state", positionals: ["SERVICE", "ACCOUNT"], options: [
                OptionSpec("--json", help: "one JSON object: state, generation, expires"),
            ], summary: """
                Prints one word: available, requires-authentication, invalidated, expired or
                not-found. Never prompts.
                """),
            CommandSpec("lock", summary: "Ends every authentication reuse window of yours at once."),
            CommandSpec("status", summary: "Shows how the broker protects the vault: key protector (tpm or file), rollback detection."),
            CommandSpec("biometry", summary: "Shows your fingerprint reader, enrolled fingers, and items bound to them."),
            CommandSpec("audit", options: [
                OptionSpec("--json", help: "JSON Lines instead of a table"),
                OptionSpec("--since", value: "TIME", help: "entries from TIME (2026-12-02T10:00:00Z, 2026-12-02, or @EPOCH)"),
                OptionSpec("--item", value: "SERVICE/ACCOUNT", help: "entries about one item"),
                OptionSpec("--follow", help: "keep printing new entries as they happen"),
            ], summary: "Shows audit entries about your items and requests (root: all).", subcommands: [
                CommandSpec("audit verify", options: [
                    OptionSpec("--export", value: "FILE", help: "check an exported file instead (anyone may; the broker holds the key)"),
                ], summary: "Checks the whole audit chain; names the first altered entry."),
                CommandSpec("audit export", positionals: ["FILE"], options: [
                    OptionSpec("--until", value: "TIME", help: "entries up to TIME (required)"),
                ], summary: """
                    Writes every entry up to TIME as JSON Lines: a header line, then each entry with its
                    row bytes and MACs, so `audit verify --export FILE` checks it later. Root only.
                    """),
                CommandSpec("audit prune", options: [
                    OptionSpec("--until", value: "TIME", help: "entries up to TIME (required)"),
                ], summary: "Removes entries up to TIME, leaving a checkpoint. Root only."),
            ]),
            CommandSpec("secret-service", options: [
                OptionSpec("--default-policy", value: "EXPR", help: "the policy of items created through D-Bus (default none)"),
                OptionSpec("--reuse", value: "SECONDS", help: "the reuse window of those items (default 60)"),
                OptionSpec("--replace", help: "take org.freedesktop.secrets over from the program that owns it"),
            ], summary: """
                Runs the Secret Service agent (keyhold-secret-service) on your session bus, so
                secret-tool, python keyring and desktop apps keep their secrets in the vault. It
                holds no key: every call goes to the broker as you.
                """),
            ImportCommand.spec, ExportCommand.spec, BackupCommand.spec,
            CommandSpec("demo", options: [
                OptionSpec("--non-interactive", help: "answer the demo prompt through an askpass program"),
            ], summary: "Starts a broker on a temporary vault, stores, reads, lists and audits; then cleans up."),
        ],
        globalOptions: [OptionSpec("--socket", value: "PATH", help: "broker socket (else $KEYHOLD_SOCKET, else /run/keyhold/keyhold.sock)")],
        overview: "Keyhold: secrets released only after the broker authenticates you, every access audited.")

    public static func main(_ arguments: [String]) -> Int32 {
        let parsed: (globals: [String: String], command: ParsedCommand)
        do throws(ArgumentError) {
            parsed = try parser.parse(RotateCommand.split(arguments).options)
        } catch .help(let text) {
            Output.out(text)
            return 0
        } catch {
            Output.err(error.description)
            return Int32(Outcome.usage.rawValue)
        }
        Terminal.installInterruptHandler()
        let vault = Vault(socketPath: parsed.globals["--socket"])
        let c = parsed.command
        do throws(KeyholdError) {
            switch c.name {
            case "put": try put(vault, c)
            case "get": try get(vault, c)
            case "rotate": try RotateCommand.run(vault, c, command: RotateCommand.split(arguments).command)
            case "rm":
                try vault.delete(service: c.positionals[0], account: c.positionals[1], reason: c.value("--reason"),
                                 interaction: c.flag("--no-interaction") ? nil : PromptInteraction())
            case "ls": try list(vault, json: c.flag("--json"))
            case "state": try state(vault, c)
            case "lock": try vault.lock()
            case "status": Output.out(try vault.protectionStatus() + "\n")
            case "biometry": try biometry(vault)
            case "audit": try AuditCommands.show(vault, c)
            case "audit verify":
                if let file = c.value("--export") { return try AuditCommands.verifyExport(vault, path: file) }
                return try AuditCommands.verify(vault)
            case "audit export": try AuditCommands.export(vault, c)
            case "audit prune": try AuditCommands.prune(vault, c)
            case "export": return try ExportCommand.run(vault, c)
            case "backup": return try BackupCommand.run(vault, c)
            case _ where ImportCommand.handles(c.name): return try ImportCommand.run(vault, c)
            case "demo": return Demo.run(nonInteractive: c.flag("--non-interactive"))
            default: throw .invalidRequest("unknown command")
            }
        } catch {
            Output.err(message(error, command: c, socket: parsed.globals["--socket"]))
            return Int32(error.outcome.rawValue)
        }
        return 0
    }

    /// The error line for a failed command: it names the item the command is about, says how
    /// to start a broker that is not running, and how to answer prompts without a terminal.
    static func message(_ error: KeyholdError, command c: ParsedCommand, socket: String?) -> String {
        var text: String
        switch error {
        case .notFound: text = "not found"
        case .brokerUnavailable(let why):
            text = error.description
            // connect(2) said no socket file, or nobody listening on it: no broker runs there.
            let notRunning = [ENOENT, ECONNREFUSED].contains { why.hasSuffix(": " + String(cString: strerror($0))) }
            if notRunning {
                text += "; keyholdd is not running (start it: sudo systemctl start keyholdd"
                text += socket == nil && getenv("KEYHOLD_SOCKET") == nil ? ")" : "; or check --socket / KEYHOLD_SOCKET)"
            }
            return text
        case .interactionNotAllowed:
            text = error.description
            text += c.flag("--no-interaction") ? " (--no-interaction)"
                : "; without a terminal, set KEYHOLD_ASKPASS to a program that asks (see keyhold help get)"
        default: text = error.description
        }
        // A usage error is about the arguments, not the item.
        let itemCommands: Set = ["put", "get", "rm", "state", "rotate"]
        guard itemCommands.contains(c.name), c.positionals.count == 2, error.outcome != .usage else { return text }
        return "\(c.positionals[0]) / \(c.positionals[1]): " + text
    }

    static func put(_ vault: Vault, _ c: ParsedCommand) throws(KeyholdError) {
        let service = c.positionals[0], account = c.positionals[1]
        let policy: Policy
        do throws(Policy.ParseError) {
            policy = try Policy(parsing: c.value("--policy") ?? "none")
        } catch {
            throw .invalidRequest(error.description)
        }
        var kind = ItemKind.generic
        if let k = c.value("--kind") {
            guard let parsed = ItemKind(name: k) else { throw .invalidRequest("unknown kind '\(k)' (refresh-token, password, generic)") }
            kind = parsed
        }
        var reuse: UInt32 = 0
        if let r = c.value("--reuse") {
            guard let n = UInt32(r), n <= Limits.maxReuseSeconds else { throw .invalidRequest("--reuse wants 0 to \(Limits.maxReuseSeconds) seconds") }
            reuse = n
        }
        let exes = c.all("--allow-exe")
        for exe in exes where !exe.hasPrefix("/") { throw .invalidRequest("--allow-exe needs an absolute path: \(exe)") }
        let access = AccessControl(policy: policy, allowedExecutables: exes, reuseSeconds: reuse)

        let secret = try readSecretForPut()
        defer { secret.wipe() }
        let interaction = PromptInteraction()
        var appPassword: SecureBytes?
        if policy.requiresAppPassword {
            guard let interaction else { throw .interactionNotAllowed }
            switch interaction.askTwice("Application password for \(service) / \(account): ") {
            case .success(let p): appPassword = p
            case .failure(let e): throw e
            }
        }
        defer { appPassword?.wipe() }
        var ifGeneration: UInt64?
        if let g = c.value("--if-generation") {
            guard c.flag("--update"), let n = UInt64(g) else { throw .invalidRequest("--if-generation wants --update and a generation number") }
            ifGeneration = n
        }
        let expires = try expiry(c)
        if c.flag("--update") {
            try vault.update(secret, service: service, account: account, label: c.value("--label") ?? "", kind: kind,
                             access: access, appPassword: appPassword, ifGeneration: ifGeneration, expires: expires,
                             interaction: interaction)
        } else {
            try vault.add(secret, service: service, account: account, label: c.value("--label") ?? "", kind: kind,
                          access: access, appPassword: appPassword, expires: expires, interaction: interaction)
        }
    }

    /// `--expires TIME` (the forms of `audit --since`), µs since the epoch.
    static func expiry(_ c: ParsedCommand) throws(KeyholdError) -> Int64? {
        guard let text = c.value("--expires") else { return nil }
        guard let t = Time.parse(text) else {
            throw .invalidRequest("--expires wants 2026-12-02T10:00:00Z, 2026-12-02, @EPOCH or now")
        }
        return t
    }

    /// The secret for `put`: all of standard input, or from a terminal, asked twice.
    static func readSecretForPut() throws(KeyholdError) -> SecureBytes {
        if isatty(0) != 0 {
            let tty = PromptInteraction()
            guard let tty else { throw .interactionNotAllowed }
            switch tty.askTwice("Secret: ") {
            case .success(let s): return s
            case .failure(let e): throw e
            }
        }
        guard let secret = Terminal.readSecret(0, stopAtNewline: false, limit: Limits.maxSecretBytes) else {
            throw .invalidRequest("could not read the secret from standard input")
        }
        guard secret.count <= Limits.maxSecretBytes else {
            secret.wipe()
            throw .invalidRequest("secret exceeds the \(Limits.maxSecretBytes)-byte limit")
        }
        return secret
    }

    static func get(_ vault: Vault, _ c: ParsedCommand) throws(KeyholdError) {
        let interaction = c.flag("--no-interaction") ? nil : PromptInteraction()
        if c.flag("--json") {
            let r = try vault.release(service: c.positionals[0], account: c.positionals[1], reason: c.value("--reason"),
                                      interaction: interaction)
            defer { r.secret.wipe() }
            Output.out(JSON.object([("secret", .string(Output.base64(r.secret))), ("generation", .number(Int64(clamping: r.generation))),
                                    ("expires", r.expires.map { .string(Time.iso8601($0)) } ?? .null)]) + "\n")
            return
        }
        let secret = try vault.secret(service: c.positionals[0], account: c.positionals[1],
                                      reason: c.value("--reason"), interaction: interaction)
        defer { secret.wipe() }
        let ok = secret.withUnsafeBytes { DescriptorIO.writeAll(1, $0) == 0 }
        if !ok { throw .other("could not write the secret to standard output") }
        // On a terminal a newline keeps the prompt off the secret's line; a pipe or a file
        // gets the stored bytes exactly.
        let endsInNewline = secret.withUnsafeBytes { $0.last == UInt8(ascii: "\n") }
        if isatty(1) != 0 && !endsInNewline { Output.out("\n") }
    }

    static func list(_ vault: Vault, json: Bool) throws(KeyholdError) {
        let items = try vault.items()
        if json {
            for i in items {
                Output.out(JSON.object([
                    ("id", .string(i.id)), ("service", .string(i.service)), ("account", .string(i.account)),
                    ("label", .string(i.label)), ("kind", .string(i.kind.name)), ("policy", .string(i.policy)),
                    ("allowed_executables", .array(i.allowedExecutables.map { .string($0) })),
                    ("reuse_seconds", .number(Int64(i.reuseSeconds))),
                    ("created", .string(Time.iso8601(i.createdAt))), ("updated", .string(Time.iso8601(i.updatedAt))),
                    ("generation", .number(Int64(clamping: i.generation))),
                    ("expires", i.expires.map { .string(Time.iso8601($0)) } ?? .null),
                    ("attributes", ListAttributes.json(i)),
                ]) + "\n")
            }
            return
        }
        // An ATTRIBUTES column only when some item carries a Secret Service attribute map.
        let withAttributes = items.contains(where: ListAttributes.isEncoded)
        var rows = [["SERVICE", "ACCOUNT", "KIND", "POLICY", "GEN", "EXPIRES", "LABEL"] + (withAttributes ? ["ATTRIBUTES"] : [])]
        for i in items {
            rows.append([i.service, i.account, i.kind.name, i.policy, String(i.generation),
                         i.expires.map { Time.iso8601($0) } ?? "-", i.label] + (withAttributes ? [ListAttributes.text(i)] : []))
        }
        Output.out(Output.table(rows, width: TextWidth.table))
    }

    static func state(_ vault: Vault, _ c: ParsedCommand) throws(KeyholdError) {
        let service = c.positionals[0], account = c.positionals[1]
        let s = try vault.itemStatus(service: service, account: account)
        if c.flag("--json") {
            Output.out(JSON.object([("state", .string(s.state.rawValue)),
                                    ("generation", s.generation.map { .number(Int64(clamping: $0)) } ?? .null),
                                    ("expires", s.expires.map { .string(Time.iso8601($0)) } ?? .null)]) + "\n")
        } else {
            Output.out(s.state.rawValue + "\n")
        }
        if let left = s.lockoutSecondsLeft {
            Output.err("locked out for \(left) more seconds")
        }
    }

    static func biometry(_ vault: Vault) throws(KeyholdError) {
        let info = try vault.biometry()
        // The reader's and fingers' names come from the bus: shown escaped like any peer's text.
        // The broker keeps no D-Bus client (it runs as root); the reader's name is asked here.
        let reader = info.reader ?? BiometryReader.readerDescription()
        Output.out("reader: \(Printable.escape(reader ?? "unknown"))\n")
        Output.out("enrolled fingers: \(info.enrolledFingers.isEmpty ? "none" : info.enrolledFingers.map { Printable.escape($0) }.joined(separator: ", "))\n")
        Output.out("items bound to the current set (invalidated by any change): \(info.itemsBoundToCurrentSet)\n")
    }
}
