import Glibc
import KeyholdClient
import KeyholdCore

/// A pass store: every `*.gpg` file under it (hidden names like `.git` and `.gpg-id` skipped,
/// symlinked directories not followed) is one entry, decrypted by `gpg --decrypt` only when its
/// item is new. gpg's own agent asks for the key's passphrase (pinentry), never keyhold; the
/// decrypted bytes come back through a pipe. Item: service `pass:ENTRY` (the path without
/// `.gpg`), account the first `login:`, `username:` or `user:` line's value, else the entry's
/// last path component; the secret is the whole entry, exactly as `pass show` prints it.
enum ImportPass {
    static let prefix = "pass:"
    static let maxDepth = 32

    static func read(store: String?) throws(KeyholdError) -> ImportSource {
        let dir = store ?? getenv("PASSWORD_STORE_DIR").map { String(cString: $0) }
            ?? ImportInput.home().map { $0 + "/.password-store" }
        guard let dir else { throw .invalidRequest("no pass store: give --store DIR") }
        var info = stat()
        guard stat(dir, &info) == 0, info.st_mode & S_IFMT == S_IFDIR else { throw .other("no pass store at \(dir)") }
        guard let gpg = RotateCommand.resolve("gpg") else { throw .other("gpg is not installed (apt-get install gnupg)") }
        var source = ImportSource()
        var names: [String] = []
        walk(dir, "", depth: 0, into: &names, &source)
        names.sort()
        let decryptor = Decryptor(gpg: gpg, files: names.map { "\(dir)/\($0).gpg" })
        source.plan = { decryptor.planned = $0 }
        for (index, name) in names.enumerated() {
            let last = String(name.split(separator: "/").last ?? Substring(name))
            source.entries.append(ImportEntry(origin: name, service: prefix + name, account: nil, label: "pass",
                                              kind: .password, onePerService: true,
                                              open: { () throws(KeyholdError) in try decryptor.open(index, fallbackAccount: last) }))
        }
        return source
    }

    static func walk(_ dir: String, _ prefix: String, depth: Int, into names: inout [String], _ source: inout ImportSource) {
        guard depth < maxDepth, let d = opendir(dir + (prefix.isEmpty ? "" : "/" + prefix)) else {
            source.unusable.append((prefix.isEmpty ? dir : prefix, "cannot read the directory"))
            return
        }
        defer { closedir(d) }
        while let e = readdir(d) {
            let name = withUnsafeBytes(of: e.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            guard !name.hasPrefix(".") else { continue }
            let relative = prefix.isEmpty ? name : prefix + "/" + name
            var info = stat()
            guard lstat(dir + "/" + relative, &info) == 0 else { continue }
            let type = info.st_mode & S_IFMT
            if type == S_IFDIR {
                walk(dir, relative, depth: depth + 1, into: &names, &source)
            } else if name.hasSuffix(".gpg"), type == S_IFREG || (type == S_IFLNK && stat(dir + "/" + relative, &info) == 0
                                                                    && info.st_mode & S_IFMT == S_IFREG) {
                let entry = String(relative.dropLast(4))
                if entry.utf8.count + prefix.utf8.count <= Limits.maxTextBytes { names.append(entry) } else {
                    source.unusable.append((entry, "the entry's name is longer than \(Limits.maxTextBytes) bytes"))
                }
            }
        }
    }

    /// Decrypts the entries the driver will store, in its order, with up to `ahead` gpg
    /// processes at once (one gpg per entry is the import's cost: about 25 ms here). Each
    /// child's stdout is a pipe read only when its entry is opened; an entry's text fits the
    /// pipe, so the children ahead finish meanwhile. Our stdin is theirs, so gpg names our
    /// terminal to its agent and pinentry (not keyhold) asks for a passphrase there, as under
    /// `pass show`; the agent asks once at a time.
    final class Decryptor {
        static let ahead = 4
        let gpg: String
        let files: [String]
        /// The entries to open, in order (the new ones), and where each stands in that order.
        var planned: [Int] = [] { didSet { position = Dictionary(uniqueKeysWithValues: planned.enumerated().map { ($1, $0) }) } }
        private var position: [Int: Int] = [:]
        private var running: [Int: (pid: pid_t, stdout: Int32)] = [:]

        init(gpg: String, files: [String]) {
            self.gpg = gpg
            self.files = files
        }

        deinit {
            // Children started ahead for entries never opened (the import stopped early).
            for (_, child) in running {
                kill(child.pid, SIGTERM)
                ImportInput.collect(child, limit: 0).output.wipe()
            }
        }

        func open(_ index: Int, fallbackAccount: String) throws(KeyholdError) -> (account: String, secret: SecureBytes) {
            var next = [index]
            if let at = position[index] { next += planned[(at + 1)...].prefix(Self.ahead - 1) }
            for i in next where running[i] == nil {
                running[i] = ImportInput.start(gpg, ["--quiet", "--yes", "--decrypt", "--", files[i]])
            }
            guard let child = running.removeValue(forKey: index) else { throw .other("cannot run gpg") }
            let (plain, status) = ImportInput.collect(child, limit: Limits.maxSecretBytes)
            guard status == 0 else {
                plain.wipe()
                throw .other(status.map { "gpg could not decrypt it (exit \($0))" } ?? "gpg was killed")
            }
            guard plain.count <= Limits.maxSecretBytes else {
                plain.wipe()
                throw .invalidRequest("the entry is larger than \(Limits.maxSecretBytes) bytes")
            }
            return (login(plain) ?? fallbackAccount, plain)
        }
    }

    /// The value of the first `login:`/`username:`/`user:` line after the first (the password).
    static func login(_ plain: SecureBytes) -> String? {
        plain.withUnsafeBytes { raw in
            for (number, range) in ImportInput.lines(raw) where number > 1 {
                let line = Array(raw[range])
                guard let colon = line.firstIndex(of: UInt8(ascii: ":")) else { continue }
                let key = String(decoding: line[..<colon], as: UTF8.self).lowercased()
                guard ["login", "username", "user"].contains(key) else { continue }
                let value = line[(colon + 1)...].drop { $0 == 0x20 || $0 == 0x09 }
                guard let name = ImportInput.name(value), !name.isEmpty,
                      !name.unicodeScalars.contains(where: { $0.properties.generalCategory == .control }) else { return nil }
                return name
            }
            return nil
        }
    }
}
