import Glibc
import KeyholdCLI
import KeyholdClient
import KeyholdCore

/// `docker-credential-keyhold store|get|erase|list|version`, the docker-credential-helpers
/// protocol: a miss prints `credentials not found in native keychain` on stdout and exits 1;
/// any other failure is one line on stderr and exit 1, as docker expects of a helper.
public enum DockerCredentialHelper {
    static let name = "docker-credential-keyhold"
    static let usage = "usage: docker-credential-keyhold store|get|erase|list|version"

    public static func main(_ arguments: [String], vault: Vault = Vault()) -> Int32 {
        guard arguments.count == 1 else { return fail(usage) }
        let action = arguments[0]
        if action == "version" { print("docker-credential-keyhold (Keyhold)"); return 0 }
        guard ["store", "get", "erase", "list"].contains(action) else { return fail(usage) }
        PromptSupport.installInterruptHandler()
        do throws(KeyholdError) {
            switch action {
            case "list": return try list(vault)
            case "store": return try store(vault)
            default:
                guard let url = readURL() else { return 1 }
                return action == "get" ? try get(vault, url) : try erase(vault, url)
            }
        } catch {
            return fail(error.description)
        }
    }

    static func fail(_ text: String) -> Int32 {
        HelperInput.complain(name, text)
        return 1
    }

    static func notFound() -> Int32 {
        print(DockerCredentialProtocol.notFoundMessage)
        return 1
    }

    /// `get` and `erase` read the bare server URL (not a secret) on stdin.
    static func readURL() -> String? {
        switch HelperInput.read(0, limit: Limits.maxTextBytes, stopAtBlankLine: false) {
        case .failure(let e):
            _ = fail(e.description)
            return nil
        case .success(let bytes):
            defer { bytes.wipe() }
            guard bytes.withUnsafeBytes({ !$0.contains(0) }),
                  let text = bytes.withUnsafeBytes({ String(validating: $0, as: UTF8.self) }) else {
                _ = fail("the server URL is not UTF-8 text without NUL bytes")
                return nil
            }
            guard CredentialMapping.dockerHost(text) != nil else {
                _ = fail("no credentials server URL")
                return nil
            }
            return text.trimmingWhitespace()
        }
    }

    static func items(_ vault: Vault, host: String) throws(KeyholdError) -> [ItemInfo] {
        let service = CredentialMapping.dockerService(host: host)
        return try vault.items().filter { $0.service == service }.sorted { $0.updatedAt > $1.updatedAt }
    }

    static func store(_ vault: Vault) throws(KeyholdError) -> Int32 {
        let input: SecureBytes
        switch HelperInput.read(0, stopAtBlankLine: false) {
        case .success(let b): input = b
        case .failure(let e): return fail(e.description)
        }
        let credential: DockerCredential
        do throws(DockerCredentialParseError) {
            credential = try DockerCredentialProtocol.parseStore(input)
        } catch {
            input.wipe()
            return fail(error.description)
        }
        input.wipe()
        guard let host = CredentialMapping.dockerHost(credential.serverURL) else { return fail("no credentials server URL") }
        let service = CredentialMapping.dockerService(host: host)
        let existing = try items(vault, host: host)
        // One credential per registry, as in docker's own config: others for it go first.
        let interaction = PromptInteraction()
        for other in existing where other.account != credential.username {
            try CredentialMapping.delete(vault, service: service, account: other.account, interaction: interaction)
        }
        if let same = existing.first(where: { $0.account == credential.username }) {
            try vault.update(credential.secret, service: service, account: credential.username, label: credential.serverURL,
                             kind: .password, access: CredentialMapping.access(of: same) ?? AccessControl(),
                             reason: "docker credential store", interaction: interaction)
        } else {
            try vault.add(credential.secret, service: service, account: credential.username, label: credential.serverURL,
                          kind: .password)
        }
        return 0
    }

    static func get(_ vault: Vault, _ url: String) throws(KeyholdError) -> Int32 {
        guard let host = CredentialMapping.dockerHost(url), let item = try items(vault, host: host).first else { return notFound() }
        let secret: SecureBytes
        do throws(KeyholdError) {
            secret = try vault.secret(service: item.service, account: item.account, reason: "docker credential get",
                                      interaction: PromptInteraction())
        } catch .notFound {
            return notFound()
        }
        defer { secret.wipe() }
        guard secret.withUnsafeBytes({ String(validating: $0, as: UTF8.self) != nil }) else {
            return fail("\(item.service): the stored secret is not UTF-8 text and cannot be passed to docker")
        }
        let reply = DockerCredentialProtocol.reply(serverURL: url, username: item.account, secret: secret)
        defer { reply.wipe() }
        guard HelperInput.write(1, reply) else { return fail("could not write to standard output") }
        return 0
    }

    /// Erases the registry's credential under every URL form (docker logout tries each).
    static func erase(_ vault: Vault, _ url: String) throws(KeyholdError) -> Int32 {
        guard let host = CredentialMapping.dockerHost(url) else { return notFound() }
        let found = try items(vault, host: host)
        guard !found.isEmpty else { return notFound() }
        let interaction = PromptInteraction()
        for item in found {
            try CredentialMapping.delete(vault, service: item.service, account: item.account, interaction: interaction)
        }
        return 0
    }

    static func list(_ vault: Vault) throws(KeyholdError) -> Int32 {
        let entries = try vault.items()
            .filter { $0.service.hasPrefix(CredentialMapping.dockerPrefix) }
            .map { (url: $0.label.isEmpty ? String($0.service.dropFirst(CredentialMapping.dockerPrefix.count)) : $0.label, username: $0.account) }
            .sorted { $0.url < $1.url }
        Output.raw(DockerCredentialProtocol.listReply(entries))
        return 0
    }
}

enum Output {
    static func raw(_ text: String) {
        _ = text.withCString { Glibc.write(1, $0, strlen($0)) }
    }
}
