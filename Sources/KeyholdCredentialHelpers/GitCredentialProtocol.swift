import KeyholdCore

/// A credential description as git-credential(1) passes it: `key=value` lines. Text fields are
/// Strings; the password and OAuth refresh token stay in guarded memory.
public final class GitCredential {
    public var protocolName: String?
    public var host: String?
    public var path: String?
    public var username: String?
    public var password: SecureBytes?
    /// Unix seconds (git 2.41+); a credential past it is never returned.
    public var passwordExpiryUTC: Int64?
    public var oauthRefreshToken: SecureBytes?

    public init() {}

    deinit { wipe() }

    public func wipe() {
        password?.wipe()
        oauthRefreshToken?.wipe()
    }
}

/// Why a description was refused. Names the line and the attribute, never a value.
public enum GitCredentialParseError: Error, Equatable, CustomStringConvertible {
    case nulByte(line: Int)
    case missingEquals(line: Int)
    case valueTooLong(key: String, line: Int, limit: Int)
    case notUTF8(key: String, line: Int)
    case badExpiry(line: Int)
    case badURL(line: Int)

    public var description: String {
        switch self {
        case .nulByte(let l): "line \(l): NUL byte in input; nothing done"
        case .missingEquals(let l): "line \(l): invalid credential line (no '='); nothing done"
        case .valueTooLong(let k, let l, let limit): "line \(l): \(k) exceeds \(limit) bytes; nothing done"
        case .notUTF8(let k, let l): "line \(l): \(k) is not UTF-8 text; nothing done"
        case .badExpiry(let l): "line \(l): password_expiry_utc is not a number of seconds; nothing done"
        case .badURL(let l): "line \(l): url is not scheme://[user@]host[/path] as git reads it; nothing done"
        }
    }
}

/// The one parser of git's credential protocol (and of the same lines inside a stored item).
public enum GitCredentialProtocol {
    /// Parses `input` up to its end or its first empty line. Unknown attributes (`wwwauth[]`,
    /// `capability[]`, future ones) are ignored; a repeated attribute keeps its last value, as
    /// git does. Any NUL byte, a line without `=`, an oversized or non-UTF-8 value refuses the
    /// whole description, so nothing is acted on half-way.
    public static func parse(_ input: SecureBytes) throws(GitCredentialParseError) -> GitCredential {
        let c = GitCredential()
        do throws(GitCredentialParseError) {
            try input.withUnsafeBytes { (raw) throws(GitCredentialParseError) in
                if let nul = raw.firstIndex(of: 0) {
                    throw .nulByte(line: raw[..<nul].count(where: { $0 == UInt8(ascii: "\n") }) + 1)
                }
                var start = 0
                var lineNumber = 0
                while start < raw.count {
                    lineNumber += 1
                    var end = raw[start...].firstIndex(of: UInt8(ascii: "\n")) ?? raw.count
                    let next = end + 1
                    if end > start && raw[end - 1] == UInt8(ascii: "\r") { end -= 1 }
                    if end == start { break }  // the blank line that ends a description
                    let line = UnsafeRawBufferPointer(rebasing: raw[start..<end])
                    guard let eq = line.firstIndex(of: UInt8(ascii: "=")) else { throw .missingEquals(line: lineNumber) }
                    let key = String(decoding: line[..<eq], as: UTF8.self)
                    let value = UnsafeRawBufferPointer(rebasing: line[(eq + 1)...])
                    try apply(key: key, value: value, line: lineNumber, to: c)
                    start = next
                }
            }
        } catch {
            c.wipe()
            throw error
        }
        return c
    }

    static func apply(key: String, value: UnsafeRawBufferPointer, line: Int, to c: GitCredential) throws(GitCredentialParseError) {
        func text() throws(GitCredentialParseError) -> String {
            guard value.count <= Limits.maxTextBytes else {
                throw .valueTooLong(key: key, line: line, limit: Limits.maxTextBytes)
            }
            guard let s = String(validating: value, as: UTF8.self) else { throw .notUTF8(key: key, line: line) }
            return s
        }
        func secret() throws(GitCredentialParseError) -> SecureBytes {
            guard value.count <= Limits.maxSecretBytes else {
                throw .valueTooLong(key: key, line: line, limit: Limits.maxSecretBytes)
            }
            return SecureBytes(copying: value)
        }
        switch key {
        case "protocol": c.protocolName = try text()
        case "host": c.host = try text()
        case "path": c.path = try text()
        case "username": c.username = try text()
        case "password":
            c.password?.wipe()
            c.password = try secret()
        case "oauth_refresh_token":
            c.oauthRefreshToken?.wipe()
            c.oauthRefreshToken = try secret()
        case "password_expiry_utc":
            let t = try text()
            guard !t.isEmpty, t.utf8.count <= 19, t.utf8.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }), let n = Int64(t) else {
                throw .badExpiry(line: line)
            }
            c.passwordExpiryUTC = n
        case "url":
            // As git's credential_read: a url clears everything read before it, then sets
            // protocol, host, path, username and password exactly as git's parser would.
            guard value.count <= Limits.maxTextBytes + Limits.maxSecretBytes else {
                throw .valueTooLong(key: key, line: line, limit: Limits.maxTextBytes + Limits.maxSecretBytes)
            }
            let parts: GitCredentialURL.Parts
            do throws(GitCredentialURL.Refusal) {
                parts = try GitCredentialURL.parse(value)
            } catch .notUTF8 {
                throw .notUTF8(key: key, line: line)
            } catch {
                throw .badURL(line: line)
            }
            c.wipe()
            c.protocolName = parts.protocolName
            c.host = parts.host
            c.path = parts.path
            c.username = parts.username
            c.password = parts.password
            c.passwordExpiryUTC = nil
            c.oauthRefreshToken = nil
        default:
            break  // unknown attributes are ignored, never an error
        }
    }

    /// A value that can go back on one protocol line: no newline, no NUL.
    public static func isLineSafe<Bytes: Sequence<UInt8>>(_ bytes: Bytes) -> Bool {
        !bytes.contains { $0 == UInt8(ascii: "\n") || $0 == 0 }
    }

    /// `get`'s answer. Nil when a value cannot be sent on one line (an item made by hand whose
    /// secret ends in a newline, say): git would misread it.
    public static func reply(username: String, password: SecureBytes, expiry: Int64?, refreshToken: SecureBytes?) -> SecureBytes? {
        guard isLineSafe(username.utf8),
              password.withUnsafeBytes({ isLineSafe($0) }),
              refreshToken?.withUnsafeBytes({ isLineSafe($0) }) ?? true else { return nil }
        let w = SecureWriter()
        w.append("username=\(username)\npassword=")
        w.append(password)
        w.append("\n")
        if let expiry { w.append("password_expiry_utc=\(expiry)\n") }
        if let refreshToken {
            w.append("oauth_refresh_token=")
            w.append(refreshToken)
            w.append("\n")
        }
        return w.finish()
    }
}
