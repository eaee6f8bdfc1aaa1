import KeyholdClient
import KeyholdCore

/// docker's config.json (podman's and skopeo's auth.json have the same `auths`): each
/// `"auths": {SERVERURL: {"auth": base64("user:password")}}` entry, or an `identitytoken`
/// (stored as docker stores it through a helper: account `<token>`), becomes the item
/// docker-credential-keyhold's `store` makes: service `docker:HOST`, account the user, kind
/// `password`, label the server URL as written. An entry without credentials (docker keeps
/// them in a credential store already) is skipped.
enum ImportDockerConfig {
    static func read(path: String) throws(KeyholdError) -> ImportSource {
        let file = try ImportInput.readFile(path, limit: 16 << 20)
        defer { file.wipe() }
        var source = ImportSource()
        var failure: KeyholdError?
        file.withUnsafeBytes { raw in
            let root: ImportJSON.Value
            switch ImportJSON.parse(raw) {
            case .success(let v): root = v
            case .failure(let e): failure = .invalidRequest("\(path): \(e.description)"); return
            }
            guard case .object(let auths)? = root.member("auths") else { return }
            for (serverURL, entry) in auths {
                let origin = "\(path) auths \(Printable.escape(serverURL, limit: 80))"
                guard let host = HelperItemNames.dockerHost(serverURL) else {
                    source.unusable.append((origin, "no registry host in the key"))
                    continue
                }
                switch credential(raw, entry) {
                case .none: source.skipped.append((origin, "no credentials in the file (a credential store keeps them)"))
                case .some(.failure(let why)): source.unusable.append((origin, why.description))
                case .some(.success(let (username, secret))):
                    source.entries.append(ImportEntry(origin: origin, service: HelperItemNames.dockerService(host: host),
                                                      account: username, label: serverURL, kind: .password, onePerService: true,
                                                      open: { (account: username, secret: secret.withUnsafeBytes { SecureBytes(copying: $0) }) }))
                }
            }
        }
        if let failure { throw failure }
        if !source.entries.isEmpty {
            source.afterward = """
                To have docker use the vault from now on, set "credsStore": "keyhold" in \(path) (podman, skopeo,
                buildah: "credHelpers": {"REGISTRY": "keyhold"} in auth.json) with docker-credential-keyhold on PATH,
                then remove the "auth" values from "auths" (docker logout and login again also does it).

                """
        }
        return source
    }

    /// The user name and secret of one `auths` entry: `identitytoken`, else `auth`, else
    /// `username` and `password`. Nil when it has none of them.
    static func credential(_ raw: UnsafeRawBufferPointer, _ entry: ImportJSON.Value) -> Result<(String, SecureBytes), KeyholdError>? {
        func secret(_ name: String) -> SecureBytes?? {
            guard let r = entry.member(name)?.stringRange, !r.isEmpty else { return .none }
            return .some(ImportJSON.secret(raw, r))
        }
        if let token = secret("identitytoken") {
            guard let token else { return .failure(.invalidRequest("identitytoken is not a valid JSON string")) }
            return .success(("<token>", token))
        }
        if let auth = secret("auth") {
            guard let auth else { return .failure(.invalidRequest("auth is not a valid JSON string")) }
            defer { auth.wipe() }
            guard let decoded = base64(auth) else { return .failure(.invalidRequest("auth is not base64")) }
            defer { decoded.wipe() }
            return decoded.withUnsafeBytes { d -> Result<(String, SecureBytes), KeyholdError> in
                guard let colon = d.firstIndex(of: UInt8(ascii: ":")), let user = ImportInput.name(d[0..<colon]), !user.isEmpty else {
                    return .failure(.invalidRequest("auth is not user:password"))
                }
                return .success((user, SecureBytes(copying: UnsafeRawBufferPointer(rebasing: d[(colon + 1)...]))))
            }
        }
        guard let u = entry.member("username")?.stringRange, let password = secret("password") else { return nil }
        guard let user = ImportJSON.text(raw, u), !user.isEmpty, let password else { return .failure(.invalidRequest("username or password is not valid text")) }
        return .success((user, password))
    }

    /// Standard base64 (padding optional) decoded into guarded memory; nil if malformed.
    static func base64(_ text: SecureBytes) -> SecureBytes? {
        let out = SecureBytes(count: text.count * 3 / 4 + 3)
        defer { out.wipe() }
        var n = 0, acc: UInt32 = 0, bits = 0, ok = true
        text.withUnsafeBytes { t in
            out.withUnsafeMutableBytes { o in
                var padding = false
                for c in t {
                    let v: UInt32
                    switch c {
                    case 0x41...0x5a: v = UInt32(c - 0x41)
                    case 0x61...0x7a: v = UInt32(c - 0x61 + 26)
                    case 0x30...0x39: v = UInt32(c - 0x30 + 52)
                    case UInt8(ascii: "+"): v = 62
                    case UInt8(ascii: "/"): v = 63
                    case UInt8(ascii: "="): padding = true; continue
                    default: ok = false; return
                    }
                    guard !padding else { ok = false; return }
                    acc = acc << 6 | v
                    bits += 6
                    if bits >= 8 { bits -= 8; o[n] = UInt8(truncatingIfNeeded: acc >> UInt32(bits)); n += 1 }
                }
            }
        }
        acc = 0
        guard ok, bits < 6 else { return nil }
        return out.withUnsafeBytes { SecureBytes(copying: UnsafeRawBufferPointer(rebasing: $0[0..<n])) }
    }
}
