import Glibc
import KeyholdClient
import KeyholdCore

/// `keyhold import SOURCE …`: moving in from another store. Each source is read, never
/// changed; each credential becomes one new item under `--policy`; an item that already exists
/// is never touched (counted *already present*), so running an import twice imports nothing
/// twice. No secret is printed: failures name the entry (a line number, a path, a title).
enum ImportCommand {
    static let policyOptions = [
        OptionSpec("--policy", value: "EXPR", help: "access control of every imported item (default none; no +app-password)"),
        OptionSpec("--reuse", value: "SECONDS", help: "their reuse window (0-300)"),
    ]

    static let spec = CommandSpec("import", summary: """
        Moves secrets in from pass, KeePassXC, ~/.git-credentials or a docker config.json.
        Each source is only read; an item that exists already is left alone (already present).
        """, subcommands: [
        CommandSpec("import git-credentials", positionals: ["FILE"], options: policyOptions, summary: """
            Imports a git credential-store file as the git helper's items.
            FILE is usually ~/.git-credentials; each line becomes the item git-credential-keyhold
            would have stored for it (service git:PROTOCOL://HOST[/PATH], account the user).
            """),
        CommandSpec("import docker-config", positionals: ["FILE"], options: policyOptions, summary: """
            Imports a docker config.json's "auths" as the docker helper's items.
            FILE is ~/.docker/config.json (podman, skopeo: auth.json); each registry becomes the
            item docker-credential-keyhold would have stored (service docker:HOST).
            """),
        CommandSpec("import pass", options: policyOptions + [
            OptionSpec("--store", value: "DIR", help: "the password store (default $PASSWORD_STORE_DIR, else ~/.password-store)"),
        ], summary: """
            Imports a pass store, each entry decrypted by gpg.
            gpg's agent asks for the key's passphrase. Item pass:ENTRY, account its login:,
            username: or user: line, else the entry's name; the secret is the whole entry, as
            `pass show` prints it.
            """),
        CommandSpec("import keepassxc", positionals: ["DATABASE"], options: policyOptions + [
            OptionSpec("--key-file", value: "FILE", help: "the database's key file"),
            OptionSpec("--no-password", help: "the database has no password (a key file only)"),
        ], summary: """
            Imports a KeePassXC database through keepassxc-cli export.
            keepassxc-cli asks for the database password (or reads it from standard input).
            Item keepassxc:GROUP/TITLE, account the user name (else the title), label the URL,
            secret the password; notes and TOTP seeds stay in the database.
            """),
    ])

    static func handles(_ name: String) -> Bool { name == spec.name || spec.subcommands.contains { $0.name == name } }

    static func run(_ vault: Vault, _ c: ParsedCommand) throws(KeyholdError) -> Int32 {
        let access = try accessControl(c)
        let source: ImportSource
        switch c.name {
        case "import git-credentials": source = try ImportGitCredentials.read(path: c.positionals[0])
        case "import docker-config": source = try ImportDockerConfig.read(path: c.positionals[0])
        case "import pass": source = try ImportPass.read(store: c.value("--store"))
        case "import keepassxc":
            source = try ImportKeePassXC.read(database: c.positionals[0], keyFile: c.value("--key-file"),
                                              noPassword: c.flag("--no-password"))
        default: throw .invalidRequest("import needs a source: git-credentials, docker-config, pass or keepassxc (keyhold import --help)")
        }
        var driver = ImportDriver(vault: vault, access: access)
        let counts = try driver.run(source)
        if let after = source.afterward, counts.imported + counts.present > 0 { Output.out(after) }
        return counts.failed == 0 ? 0 : Int32(Outcome.otherError.rawValue)
    }

    /// `--policy` / `--reuse` as `put` takes them; an application password would need one
    /// typed per item, so it is refused here (set it afterwards with `put --update`).
    static func accessControl(_ c: ParsedCommand) throws(KeyholdError) -> AccessControl {
        let policy: Policy
        do throws(Policy.ParseError) {
            policy = try Policy(parsing: c.value("--policy") ?? "none")
        } catch {
            throw .invalidRequest(error.description)
        }
        guard !policy.requiresAppPassword else {
            throw .invalidRequest("import cannot ask an application password per item; import, then `keyhold put --update` the item")
        }
        var reuse: UInt32 = 0
        if let r = c.value("--reuse") {
            guard let n = UInt32(r), n <= Limits.maxReuseSeconds else { throw .invalidRequest("--reuse wants 0 to \(Limits.maxReuseSeconds) seconds") }
            reuse = n
        }
        return AccessControl(policy: policy, reuseSeconds: reuse)
    }
}

/// One credential of a source, named as the item it becomes. Its secret is taken only once the
/// driver knows the item is new (a pass entry is decrypted only then).
struct ImportEntry {
    /// Where in the source (a line number, an entry's path, a title): never a secret.
    let origin: String
    let service: String
    /// Nil when the entry's content names the account (pass's `login:` line).
    let account: String?
    let label: String
    let kind: ItemKind
    /// Docker keeps one credential per registry: any item of the service means it is present.
    let onePerService: Bool
    let open: () throws(KeyholdError) -> (account: String, secret: SecureBytes)
}

/// What an importer read: its entries, the entries it could not use (origin, reason), and a
/// note for the user once something was imported (docker: how to switch to `credsStore`).
struct ImportSource {
    var entries: [ImportEntry] = []
    var unusable: [(origin: String, reason: String)] = []
    var skipped: [(origin: String, reason: String)] = []
    var afterward: String?
    /// Told which entries (indices) will be opened, in order, before the first is (pass
    /// decrypts them several at a time).
    var plan: (([Int]) -> Void)?
}

/// Stores a source's entries one by one on one kept connection, counting imported, already
/// present and failed, with a progress line when stderr is a terminal.
struct ImportDriver {
    let vault: Vault
    let access: AccessControl
    var counts = (imported: 0, present: 0, failed: 0)

    init(vault: Vault, access: AccessControl) {
        self.vault = vault
        self.access = access
    }

    mutating func run(_ source: ImportSource) throws(KeyholdError) -> (imported: Int, present: Int, failed: Int) {
        let existing = try vault.items()
        var items = Set(existing.map { Self.key($0.service, $0.account) })
        var services = Set(existing.map(\.service))
        var progress = ImportProgress(total: source.entries.count)
        for u in source.unusable { fail(u.origin, u.reason, &progress) }
        for s in source.skipped { progress.note("\(s.origin): skipped: \(s.reason)") }
        // Items this run made: another entry of the source naming one of them is a conflict
        // in the source (two passwords for one name), shown as a failure, not "present".
        var madeNow = Set<String>()
        func wanted(_ entry: ImportEntry) -> String {
            entry.onePerService || entry.account == nil ? entry.service : Self.key(entry.service, entry.account!)
        }
        func present(_ entry: ImportEntry) -> Bool {
            entry.onePerService || entry.account == nil ? services.contains(wanted(entry)) : items.contains(wanted(entry))
        }
        source.plan?(source.entries.indices.filter { !present(source.entries[$0]) })
        for entry in source.entries {
            defer { progress.update(counts) }
            let wanted = wanted(entry)
            if madeNow.contains(wanted) {
                fail(entry.origin, "names the same item as an earlier entry of the source; only the earlier one was imported", &progress)
                continue
            }
            if present(entry) {
                counts.present += 1
                continue
            }
            let opened: (account: String, secret: SecureBytes)
            do throws(KeyholdError) {
                opened = try entry.open()
            } catch {
                fail(entry.origin, error.description, &progress)
                continue
            }
            defer { opened.secret.wipe() }
            let key = Self.key(entry.service, opened.account)
            if items.contains(key) { counts.present += 1; continue }
            do throws(KeyholdError) {
                try store(entry, account: opened.account, secret: opened.secret, &progress)
                counts.imported += 1
                madeNow.insert(wanted)
            } catch .duplicateItem {
                counts.present += 1  // stored meanwhile by someone else
            } catch {
                switch error {
                case .brokerUnavailable, .auditUnavailable, .integrityFailure:
                    progress.finish()
                    throw error  // every later entry would fail the same way
                default:
                    fail(entry.origin, error.description, &progress)
                    continue
                }
            }
            items.insert(key)
            services.insert(entry.service)
        }
        progress.finish()
        var summary = "imported \(counts.imported), already present \(counts.present), failed \(counts.failed)"
        if !source.skipped.isEmpty { summary += ", skipped \(source.skipped.count)" }
        Output.out(summary + "\n")
        return counts
    }

    /// `add`, waiting out *busy* (the uid's audit budget).
    func store(_ e: ImportEntry, account: String, secret: SecureBytes, _ progress: inout ImportProgress) throws(KeyholdError) {
        try BusyBroker.waiting({ progress.waiting() }) { () throws(KeyholdError) in
            try vault.add(secret, service: e.service, account: account, label: e.label, kind: e.kind, access: access)
        }
    }

    mutating func fail(_ origin: String, _ reason: String, _ progress: inout ImportProgress) {
        counts.failed += 1
        progress.note("\(origin): \(reason)")
    }

    static func key(_ service: String, _ account: String) -> String { service + "\u{0}" + account }
}

/// `keyhold: import: 120/1000 …` redrawn in place on a terminal (at most ten times a second);
/// nothing when stderr is not one. Notes (failures) go on lines of their own above it.
struct ImportProgress {
    let total: Int
    let tty = isatty(2) != 0
    var done = 0
    var lastDraw: Int64 = 0
    var drawn = false

    init(total: Int) { self.total = total }

    mutating func update(_ c: (imported: Int, present: Int, failed: Int)) {
        done += 1
        let now = MonotonicClock.milliseconds()
        guard tty, now - lastDraw >= 100 || done == total else { return }
        lastDraw = now
        draw("keyhold: import: \(done)/\(total): imported \(c.imported), already present \(c.present), failed \(c.failed)")
    }

    mutating func waiting() {
        guard tty else { return }
        draw("keyhold: import: \(done)/\(total): the broker is busy (your audit budget); waiting")
    }

    mutating func note(_ text: String) {
        clear()
        Output.err("import: \(text)")
    }

    mutating func finish() {
        if drawn { Output.write(2, "\n") }
        drawn = false
    }

    private mutating func draw(_ line: String) {
        Output.write(2, "\r\u{1b}[K" + line)
        drawn = true
    }

    private mutating func clear() {
        if drawn { Output.write(2, "\r\u{1b}[K") }
        drawn = false
    }
}

/// A non-root uid's bulk work outruns its audit budget (1 MiB, refilled at 4 KiB/s): the broker
/// answers *busy* without doing the request. Import and export wait it out, for each item up to
/// a minute, rather than counting the item failed.
enum BusyBroker {
    static let limitMs: Int64 = 60_000

    static func waiting<T>(_ onWait: () -> Void, _ body: () throws(KeyholdError) -> T) throws(KeyholdError) -> T {
        let start = MonotonicClock.milliseconds()
        var pause: UInt32 = 50_000
        while true {
            do throws(KeyholdError) {
                return try body()
            } catch .busy(let why) {
                guard MonotonicClock.milliseconds() - start < limitMs else { throw .busy(why) }
                onWait()
                usleep(pause)
                pause = min(pause * 2, 1_000_000)
            }
        }
    }
}
