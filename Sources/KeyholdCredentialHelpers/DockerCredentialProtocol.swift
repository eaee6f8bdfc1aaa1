import KeyholdCore

/// What docker's `store` sends: `{"ServerURL": …, "Username": …, "Secret": …}`.
public final class DockerCredential {
    public let serverURL: String
    public let username: String
    public let secret: SecureBytes

    init(serverURL: String, username: String, secret: SecureBytes) {
        self.serverURL = serverURL
        self.username = username
        self.secret = secret
    }

    deinit { secret.wipe() }
}

/// Why docker's input was refused. Never carries a value.
public enum DockerCredentialParseError: Error, Equatable, CustomStringConvertible {
    case invalidJSON(offset: Int)
    case tooDeep
    case missing(String)
    case tooLong(String, limit: Int)
    case notUTF8(String)

    public var description: String {
        switch self {
        case .invalidJSON(let o): "invalid JSON at byte \(o); nothing stored"
        case .tooDeep: "JSON nested too deeply; nothing stored"
        case .missing(let k): "no credentials \(k); nothing stored"
        case .tooLong(let k, let limit): "\(k) exceeds \(limit) bytes; nothing stored"
        case .notUTF8(let k): "\(k) is not UTF-8 text; nothing stored"
        }
    }
}

/// The one parser of docker-credential JSON: RFC 8259, a top-level object whose string members
/// are taken (other members, of any type, are skipped). Strings are decoded straight into
/// guarded memory, since one of them is the secret.
public enum DockerCredentialProtocol {
    static let maxDepth = 32
    public static let notFoundMessage = "credentials not found in native keychain"

    public static func parseStore(_ input: SecureBytes) throws(DockerCredentialParseError) -> DockerCredential {
        var url: SecureBytes?, user: SecureBytes?, secret: SecureBytes?
        defer { url?.wipe(); user?.wipe() }
        do throws(DockerCredentialParseError) {
            try input.withUnsafeBytes { (raw) throws(DockerCredentialParseError) in
                var p = JSONScanner(raw: raw)
                try p.object(wanted: ["ServerURL", "Username", "Secret"]) { key, value in
                    switch key {
                    case "ServerURL": url?.wipe(); url = value
                    case "Username": user?.wipe(); user = value
                    default: secret?.wipe(); secret = value
                    }
                }
                p.skipSpace()
                guard p.at == raw.count else { throw .invalidJSON(offset: p.at) }
            }
        } catch {
            secret?.wipe()
            throw error
        }
        func text(_ b: SecureBytes?, _ name: String) throws(DockerCredentialParseError) -> String {
            guard let b, b.count > 0 else { throw .missing(name) }
            guard b.count <= Limits.maxTextBytes else { throw .tooLong(name, limit: Limits.maxTextBytes) }
            guard let s = b.withUnsafeBytes({ String(validating: $0, as: UTF8.self) }) else { throw .notUTF8(name) }
            return s
        }
        do throws(DockerCredentialParseError) {
            let serverURL = try text(url, "server URL")
            let username = try text(user, "username")
            guard let secret else { throw .missing("secret") }
            guard secret.count <= Limits.maxSecretBytes else { throw .tooLong("secret", limit: Limits.maxSecretBytes) }
            guard secret.withUnsafeBytes({ String(validating: $0, as: UTF8.self) != nil }) else { throw .notUTF8("secret") }
            return DockerCredential(serverURL: serverURL, username: username, secret: secret)
        } catch {
            secret?.wipe()
            throw error
        }
    }

    /// `get`'s answer, built in guarded memory.
    public static func reply(serverURL: String, username: String, secret: SecureBytes) -> SecureBytes {
        let w = SecureWriter()
        w.append("{\"ServerURL\":\(quote(serverURL)),\"Username\":\(quote(username)),\"Secret\":")
        let q = secret.withUnsafeBytes { quoteBytes($0) }
        w.append(q)
        q.wipe()
        w.append("}\n")
        return w.finish()
    }

    /// `list`'s answer: `{"URL":"username",…}`.
    public static func listReply(_ entries: [(url: String, username: String)]) -> String {
        "{" + entries.map { "\(quote($0.url)):\(quote($0.username))" }.joined(separator: ",") + "}\n"
    }

    static func quote(_ s: String) -> String {
        let q = Array(s.utf8).withUnsafeBytes { quoteBytes($0) }
        defer { q.wipe() }
        return q.withUnsafeBytes { String(decoding: $0, as: UTF8.self) }
    }

    /// A JSON string literal of UTF-8 bytes: quote, backslash and controls escaped.
    static func quoteBytes(_ raw: UnsafeRawBufferPointer) -> SecureBytes {
        let out = SecureBytes(count: raw.count * 6 + 2)
        var n = 0
        let hex = Hex.digits
        out.withUnsafeMutableBytes { o in
            o[n] = UInt8(ascii: "\""); n += 1
            for b in raw {
                switch b {
                case UInt8(ascii: "\""), UInt8(ascii: "\\"): o[n] = UInt8(ascii: "\\"); o[n + 1] = b; n += 2
                case 0..<0x20, 0x7f:
                    for (i, c) in [UInt8(ascii: "\\"), UInt8(ascii: "u"), UInt8(ascii: "0"), UInt8(ascii: "0"), hex[Int(b >> 4)], hex[Int(b & 15)]].enumerated() { o[n + i] = c }
                    n += 6
                default: o[n] = b; n += 1
                }
            }
            o[n] = UInt8(ascii: "\""); n += 1
        }
        defer { out.wipe() }
        return out.withUnsafeBytes { SecureBytes(copying: UnsafeRawBufferPointer(rebasing: $0[0..<n])) }
    }
}

/// A strict, bounded JSON scanner over bytes in guarded memory.
struct JSONScanner {
    let raw: UnsafeRawBufferPointer
    var at = 0

    init(raw: UnsafeRawBufferPointer) { self.raw = raw }

    mutating func skipSpace() {
        while at < raw.count, [0x20, 0x09, 0x0a, 0x0d].contains(raw[at]) { at += 1 }
    }

    mutating func expect(_ c: Character) throws(DockerCredentialParseError) {
        skipSpace()
        guard at < raw.count, raw[at] == c.asciiValue! else { throw .invalidJSON(offset: at) }
        at += 1
    }

    /// Calls `member` for each string-valued member of the top-level object named in `wanted`,
    /// its value decoded into guarded memory; every other member is checked and skipped.
    mutating func object(wanted: Set<String>, _ member: (String, SecureBytes) -> Void) throws(DockerCredentialParseError) {
        try expect("{")
        skipSpace()
        if at < raw.count && raw[at] == UInt8(ascii: "}") { at += 1; return }
        while true {
            skipSpace()
            let key = String(decoding: try plainString(), as: UTF8.self)
            try expect(":")
            skipSpace()
            if wanted.contains(key), at < raw.count, raw[at] == UInt8(ascii: "\"") {
                member(key, try string())
            } else {
                try skipValue(depth: 1)
            }
            skipSpace()
            guard at < raw.count else { throw .invalidJSON(offset: at) }
            if raw[at] == UInt8(ascii: ",") { at += 1; continue }
            if raw[at] == UInt8(ascii: "}") { at += 1; return }
            throw .invalidJSON(offset: at)
        }
    }

    mutating func skipValue(depth: Int) throws(DockerCredentialParseError) {
        guard depth < DockerCredentialProtocol.maxDepth else { throw .tooDeep }
        skipSpace()
        guard at < raw.count else { throw .invalidJSON(offset: at) }
        switch raw[at] {
        case UInt8(ascii: "\""): _ = try plainString()
        case UInt8(ascii: "{"), UInt8(ascii: "["):
            let close = raw[at] == UInt8(ascii: "{") ? UInt8(ascii: "}") : UInt8(ascii: "]")
            let isObject = close == UInt8(ascii: "}")
            at += 1
            skipSpace()
            if at < raw.count && raw[at] == close { at += 1; return }
            while true {
                if isObject { skipSpace(); _ = try plainString(); try expect(":") }
                try skipValue(depth: depth + 1)
                skipSpace()
                guard at < raw.count else { throw .invalidJSON(offset: at) }
                if raw[at] == UInt8(ascii: ",") { at += 1; continue }
                if raw[at] == close { at += 1; return }
                throw .invalidJSON(offset: at)
            }
        default:
            // true, false, null, numbers: their characters, checked loosely but bounded.
            let start = at
            while at < raw.count, let c = Optional(raw[at]), (c >= 0x30 && c <= 0x39) || "-+.eEtrufalsn".utf8.contains(c) { at += 1 }
            let word = String(decoding: UnsafeRawBufferPointer(rebasing: raw[start..<at]), as: UTF8.self)
            guard word == "true" || word == "false" || word == "null" || Double(word) != nil else { throw .invalidJSON(offset: start) }
        }
    }

    /// The bytes a string literal at `at` spans, an upper bound of its decoded length.
    func literalLength() -> Int {
        var j = at + 1
        while j < raw.count && raw[j] != UInt8(ascii: "\"") { j += raw[j] == UInt8(ascii: "\\") ? 2 : 1 }
        return min(j, raw.count) - at
    }

    /// A key or a skipped value: not secret, ordinary memory.
    mutating func plainString() throws(DockerCredentialParseError) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: literalLength())
        var result: Result<Int, DockerCredentialParseError> = .success(0)
        out.withUnsafeMutableBytes { o in
            do throws(DockerCredentialParseError) { result = .success(try decode(into: o)) } catch { result = .failure(error) }
        }
        return Array(out[0..<(try result.get())])
    }

    /// A value that may be the secret: guarded memory.
    mutating func string() throws(DockerCredentialParseError) -> SecureBytes {
        let out = SecureBytes(count: literalLength())
        defer { out.wipe() }
        var result: Result<Int, DockerCredentialParseError> = .success(0)
        out.withUnsafeMutableBytes { o in
            do throws(DockerCredentialParseError) { result = .success(try decode(into: o)) } catch { result = .failure(error) }
        }
        let n = try result.get()
        return out.withUnsafeBytes { SecureBytes(copying: UnsafeRawBufferPointer(rebasing: $0[0..<n])) }
    }

    /// Decodes the string literal at `at` (escapes, surrogate pairs) into `o`; its length.
    /// Raw control characters, bad escapes, lone surrogates and invalid UTF-8 are errors.
    mutating func decode(into o: UnsafeMutableRawBufferPointer) throws(DockerCredentialParseError) -> Int {
        guard at < raw.count, raw[at] == UInt8(ascii: "\"") else { throw .invalidJSON(offset: at) }
        at += 1
        var n = 0
        func put(_ scalar: UInt32) {
            var s = String(Unicode.Scalar(scalar)!)
            s.withUTF8 { for b in $0 { o[n] = b; n += 1 } }
        }
        func hex4() -> UInt32? {
            guard at + 4 <= raw.count else { return nil }
            var v: UInt32 = 0
            for i in 0..<4 {
                guard let d = Character(Unicode.Scalar(raw[at + i])).hexDigitValue else { return nil }
                v = v * 16 + UInt32(d)
            }
            at += 4
            return v
        }
        let start = at
        while true {
            guard at < raw.count else { throw .invalidJSON(offset: at) }
            let b = raw[at]
            if b == UInt8(ascii: "\"") { at += 1; break }
            if b < 0x20 { throw .invalidJSON(offset: at) }
            if b != UInt8(ascii: "\\") { o[n] = b; n += 1; at += 1; continue }
            at += 1
            guard at < raw.count else { throw .invalidJSON(offset: at) }
            let e = raw[at]
            at += 1
            switch e {
            case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): o[n] = e; n += 1
            case UInt8(ascii: "b"): o[n] = 8; n += 1
            case UInt8(ascii: "f"): o[n] = 12; n += 1
            case UInt8(ascii: "n"): o[n] = 10; n += 1
            case UInt8(ascii: "r"): o[n] = 13; n += 1
            case UInt8(ascii: "t"): o[n] = 9; n += 1
            case UInt8(ascii: "u"):
                guard let u = hex4() else { throw .invalidJSON(offset: at) }
                if u >= 0xD800 && u < 0xDC00 {
                    guard at + 2 <= raw.count, raw[at] == UInt8(ascii: "\\"), raw[at + 1] == UInt8(ascii: "u") else { throw .invalidJSON(offset: at) }
                    at += 2
                    guard let lo = hex4(), lo >= 0xDC00 && lo < 0xE000 else { throw .invalidJSON(offset: at) }
                    put(0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00))
                } else if u >= 0xDC00 && u < 0xE000 {
                    throw .invalidJSON(offset: at)
                } else {
                    put(u)
                }
            default: throw .invalidJSON(offset: at - 1)
            }
        }
        // Raw bytes must be UTF-8 (escapes produced valid UTF-8 already).
        guard String(validating: UnsafeRawBufferPointer(rebasing: o[0..<n]), as: UTF8.self) != nil else { throw .invalidJSON(offset: start) }
        return n
    }
}
