import KeyholdClient
import KeyholdCore

/// git's credential-store file: one `PROTOCOL://USER:PASSWORD@HOST[:PORT][/PATH]` per line,
/// user, password, host and path percent-encoded (git's `credential_from_url`). Each line
/// becomes the item git-credential-keyhold's `store` makes for it: service
/// `git:PROTOCOL://HOST[:PORT][/PATH]`, account the user, kind `password`, label
/// `git credential`, secret the password.
enum ImportGitCredentials {
    static func read(path: String) throws(KeyholdError) -> ImportSource {
        let file = try ImportInput.readFile(path, limit: 16 << 20)
        defer { file.wipe() }
        var source = ImportSource()
        file.withUnsafeBytes { raw in
            for (number, range) in ImportInput.lines(raw) {
                let line = UnsafeRawBufferPointer(rebasing: raw[range])
                guard line.contains(where: { $0 != 0x20 && $0 != 0x09 }) else { continue }
                let origin = "\(path) line \(number)"
                guard let c = parse(line) else {
                    source.unusable.append((origin, "not a PROTOCOL://USER:PASSWORD@HOST line (nothing of it is shown)"))
                    continue
                }
                let service = HelperItemNames.gitService(protocolName: c.protocolName, host: c.host, path: c.path)
                let secret = c.password
                source.entries.append(ImportEntry(origin: origin, service: service, account: c.username,
                                                  label: HelperItemNames.gitLabel, kind: .password, onePerService: false,
                                                  open: { (account: c.username, secret: secret.withUnsafeBytes { SecureBytes(copying: $0) }) }))
            }
        }
        return source
    }

    struct Credential {
        let protocolName: String, host: String, path: String?, username: String
        let password: SecureBytes
    }

    /// One line as git reads it; nil unless it has a protocol, host, user and password.
    static func parse(_ line: UnsafeRawBufferPointer) -> Credential? {
        var bytes = Array(line)  // the line holds the password: zeroed on return
        defer { for i in bytes.indices { bytes[i] = 0 } }
        guard let schemeEnd = find(bytes, Array("://".utf8), from: 0), schemeEnd > 0,
              let proto = ImportInput.name(bytes[0..<schemeEnd]) else { return nil }
        let rest = schemeEnd + 3
        let slash = bytes[rest...].firstIndex(of: UInt8(ascii: "/")) ?? bytes.count
        guard let at = bytes[rest..<slash].firstIndex(of: UInt8(ascii: "@")),
              let colon = bytes[rest..<at].firstIndex(of: UInt8(ascii: ":")) else { return nil }
        guard let username = ImportInput.name(decode(bytes[rest..<colon])), !username.isEmpty,
              let host = ImportInput.name(decode(bytes[(at + 1)..<slash])), !host.isEmpty else { return nil }
        var path: String?
        if slash < bytes.count {
            var p = decode(bytes[(slash + 1)...])
            while p.count > 1, p.last == UInt8(ascii: "/") { p.removeLast() }  // git drops trailing slashes
            guard let text = ImportInput.name(p) else { return nil }
            path = text.isEmpty ? nil : text
        }
        guard let password = decodeSecret(bytes[(colon + 1)..<at]) else { return nil }
        return Credential(protocolName: proto, host: host, path: path, username: username, password: password)
    }

    static func find(_ bytes: [UInt8], _ needle: [UInt8], from: Int) -> Int? {
        guard bytes.count >= needle.count else { return nil }
        for i in from...(bytes.count - needle.count) where Array(bytes[i..<(i + needle.count)]) == needle { return i }
        return nil
    }

    /// `%XX` decoded (a `%` not followed by two hex digits stays, as in git's url_decode).
    static func decode(_ s: ArraySlice<UInt8>) -> [UInt8] {
        var out: [UInt8] = []
        var i = s.startIndex
        while i < s.endIndex {
            if s[i] == UInt8(ascii: "%"), let v = hexByte(s, i + 1) {
                out.append(v)
                i += 3
            } else {
                out.append(s[i])
                i += 1
            }
        }
        return out
    }

    static func hexByte(_ s: ArraySlice<UInt8>, _ i: Int) -> UInt8? {
        guard i + 1 < s.endIndex,
              let hi = Character(Unicode.Scalar(s[i])).hexDigitValue, let lo = Character(Unicode.Scalar(s[i + 1])).hexDigitValue else { return nil }
        return UInt8(hi << 4 | lo)
    }

    /// The password, decoded straight into guarded memory.
    static func decodeSecret(_ s: ArraySlice<UInt8>) -> SecureBytes? {
        guard s.count <= Limits.maxSecretBytes else { return nil }
        let out = SecureBytes(count: s.count)
        var n = 0
        out.withUnsafeMutableBytes { o in
            var i = s.startIndex
            while i < s.endIndex {
                if s[i] == UInt8(ascii: "%"), let v = hexByte(s, i + 1) { o[n] = v; i += 3 } else { o[n] = s[i]; i += 1 }
                n += 1
            }
        }
        defer { out.wipe() }
        return out.withUnsafeBytes { SecureBytes(copying: UnsafeRawBufferPointer(rebasing: $0[0..<n])) }
    }
}
