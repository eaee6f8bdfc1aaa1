import KeyholdCore

/// A `url=` value read exactly as git's `credential_from_url` (credential.c) reads it, so the
/// helper never names a different host than git would (issue 36 item 4). git's rules:
///
/// - the protocol is everything before the first `://`, and must not be empty;
/// - the authority ends at the first `/`, `?` or `#` after it (so `https://a:b@evil#@github.com`
///   is host `evil`, path `#@github.com`);
/// - the user part ends at the FIRST `@` when that `@` is inside the authority; a `:` before it
///   splits user and password;
/// - each component is percent-decoded by `url_decode_mem`: text before a component's first
///   `:` is copied undecoded, `%00` and malformed escapes stay as they are;
/// - the path loses its leading and trailing slashes; an empty host is still a host (`""`);
/// - a component that decodes to a newline refuses the whole URL.
///
/// Stricter than git in one way only: a component that decodes to bytes that are not UTF-8 is
/// refused (git would pass them on; the vault's names are text).
enum GitCredentialURL {
    struct Parts {
        var protocolName: String
        var host: String
        var path: String?
        var username: String?
        var password: SecureBytes?
    }

    enum Refusal: Error { case malformed, notUTF8 }

    static func parse(_ url: UnsafeRawBufferPointer) throws(Refusal) -> Parts {
        guard let schemeEnd = firstIndex(of: Array("://".utf8), in: url), schemeEnd > 0 else { throw .malformed }
        let authorityStart = schemeEnd + 3
        let rest = url[authorityStart...]
        let slash = rest.firstIndex { $0 == ascii("/") || $0 == ascii("?") || $0 == ascii("#") } ?? url.count
        var username: [UInt8]?
        var password: SecureBytes?
        var hostStart = authorityStart
        if let at = rest.firstIndex(of: ascii("@")), at < slash {
            // git looks for the first `:` anywhere after `://`, not only before the `@`.
            if let colon = rest.firstIndex(of: ascii(":")), colon < at {
                username = decoded(url[authorityStart..<colon])
                password = decodedSecret(url[(colon + 1)..<at])
            } else {
                username = decoded(url[authorityStart..<at])
            }
            hostStart = at + 1
        }
        let host = decoded(url[hostStart..<slash])
        var pathStart = slash
        while pathStart < url.count && url[pathStart] == ascii("/") { pathStart += 1 }
        var path: [UInt8]?
        if pathStart < url.count {
            var p = decoded(url[pathStart...])
            while p.count > 1 && p.last == ascii("/") { p.removeLast() }
            path = p
        }
        let newline = ascii("\n")
        let passwordHasNewline = password?.withUnsafeBytes { $0.contains(newline) } ?? false
        guard !passwordHasNewline, ![username, host, path].contains(where: { $0?.contains(newline) ?? false }) else {
            password?.wipe()
            throw .malformed
        }
        func text(_ bytes: [UInt8]) throws(Refusal) -> String {
            guard let s = String(validating: bytes, as: UTF8.self) else { password?.wipe(); throw .notUTF8 }
            return s
        }
        return Parts(protocolName: try text(Array(url[..<schemeEnd])), host: try text(host),
                     path: try path.map { (p) throws(Refusal) in try text(p) },
                     username: try username.map { (u) throws(Refusal) in try text(u) }, password: password)
    }

    static func ascii(_ c: Unicode.Scalar) -> UInt8 { UInt8(ascii: c) }

    static func firstIndex(of needle: [UInt8], in bytes: UnsafeRawBufferPointer) -> Int? {
        guard bytes.count >= needle.count else { return nil }
        return (0...(bytes.count - needle.count)).first { i in needle.indices.allSatisfy { bytes[i + $0] == needle[$0] } }
    }

    /// git's `url_decode_mem` into `out` (at least `component.count` bytes); the decoded length.
    static func decode(_ component: Slice<UnsafeRawBufferPointer>, into out: UnsafeMutableRawBufferPointer) -> Int {
        var n = 0
        var i = component.startIndex
        // "Skip protocol part if present": text before the first `:` is copied as it is.
        if let colon = component.firstIndex(of: ascii(":")), colon > i {
            while i < colon { out[n] = component[i]; n += 1; i += 1 }
        }
        while i < component.endIndex {
            if component[i] == ascii("%"), component.endIndex - i >= 3,
               let hi = hexValue(component[i + 1]), let lo = hexValue(component[i + 2]), hi << 4 | lo != 0 {
                out[n] = hi << 4 | lo
                i += 3
            } else {
                out[n] = component[i]
                i += 1
            }
            n += 1
        }
        return n
    }

    static func decoded(_ component: Slice<UnsafeRawBufferPointer>) -> [UInt8] {
        [UInt8](unsafeUninitializedCapacity: component.count) { buffer, count in
            count = decode(component, into: UnsafeMutableRawBufferPointer(buffer))
        }
    }

    /// A password decoded in guarded memory only.
    static func decodedSecret(_ component: Slice<UnsafeRawBufferPointer>) -> SecureBytes {
        let scratch = SecureBytes(count: component.count)
        defer { scratch.wipe() }
        let n = scratch.withUnsafeMutableBytes { decode(component, into: $0) }
        return scratch.withUnsafeBytes { SecureBytes(copying: UnsafeRawBufferPointer(rebasing: $0[0..<n])) }
    }

    static func hexValue(_ c: UInt8) -> UInt8? {
        switch c {
        case ascii("0")...ascii("9"): c - ascii("0")
        case ascii("a")...ascii("f"): c - ascii("a") + 10
        case ascii("A")...ascii("F"): c - ascii("A") + 10
        default: nil
        }
    }
}
