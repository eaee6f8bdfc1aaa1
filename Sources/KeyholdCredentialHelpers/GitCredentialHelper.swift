import KeyholdCLI
import KeyholdClient
import KeyholdCore

/// `git-credential-keyhold [--policy EXPR] [--reuse SECONDS] get|store|erase`, as
/// git-credential(1) runs it. A miss, a canceled or impossible prompt, a locked-out caller: no
/// output and exit 0, so git goes on to prompt; each says why on stderr, once. Malformed input
/// or bad options exit 2, a missing broker 11 (git carries on either way).
public enum GitCredentialHelper {
    static let name = "git-credential-keyhold"
    static let usage = "usage: git-credential-keyhold [--policy EXPR] [--reuse SECONDS] get|store|erase"

    public static func main(_ arguments: [String], vault: Vault = Vault()) -> Int32 {
        var policyText: String?
        var reuse: UInt32 = 0
        var action: String?
        var i = 0
        while i < arguments.count {
            let a = arguments[i]
            switch a {
            case "--policy", "--reuse":
                guard i + 1 < arguments.count else { return fail(usage, .usage) }
                if a == "--policy" {
                    policyText = arguments[i + 1]
                } else {
                    guard let n = UInt32(arguments[i + 1]), n <= Limits.maxReuseSeconds else {
                        return fail("--reuse wants 0 to \(Limits.maxReuseSeconds) seconds", .usage)
                    }
                    reuse = n
                }
                i += 2
            case "--help", "-h":
                print(usage)
                return 0
            default:
                guard action == nil, !a.hasPrefix("-") else { return fail(usage, .usage) }
                action = a
                i += 1
            }
        }
        let policy: Policy
        do throws(Policy.ParseError) {
            policy = try Policy(parsing: policyText ?? "none")
        } catch {
            return fail(error.description, .usage)
        }
        guard !policy.requiresAppPassword else { return fail("+app-password policies are not supported for git credentials", .usage) }
        guard let action else { return fail(usage, .usage) }
        // git-credential(1): helpers ignore actions they do not know.
        guard ["get", "store", "erase"].contains(action) else { return 0 }

        let input: SecureBytes
        switch HelperInput.read(0, stopAtBlankLine: true) {
        case .success(let bytes): input = bytes
        case .failure(let e): return fail(e.description, .usage)
        }
        let request: GitCredential
        do throws(GitCredentialParseError) {
            request = try GitCredentialProtocol.parse(input)
        } catch {
            input.wipe()
            return fail(error.description, .usage)
        }
        input.wipe()
        defer { request.wipe() }
        guard let proto = request.protocolName, let host = request.host, !proto.isEmpty, !host.isEmpty else {
            return action == "store" ? fail("store needs protocol, host, username and password; nothing stored", .usage) : 0
        }
        let service = CredentialMapping.gitService(protocolName: proto, host: host, path: request.path)
        PromptSupport.installInterruptHandler()
        do throws(KeyholdError) {
            switch action {
            case "get": try get(vault, service, request)
            case "store": return try store(vault, service, request, access: AccessControl(policy: policy, reuseSeconds: reuse))
            default: try erase(vault, service, request)
            }
        } catch {
            return fail(error.description, error.outcome)
        }
        return 0
    }

    static func fail(_ text: String, _ outcome: Outcome) -> Int32 {
        HelperInput.complain(name, text)
        return Int32(outcome.rawValue)
    }

    /// The one item this request names: its username's, or the only one for the host.
    static func item(_ vault: Vault, _ service: String, _ username: String?) throws(KeyholdError) -> ItemInfo? {
        let items = try vault.items().filter { $0.service == service }
        let matching = username.map { u in items.filter { $0.account == u } } ?? items
        return matching.count == 1 ? matching[0] : nil
    }

    static func interaction() -> PromptInteraction? {
        PromptInteraction(askpassVariables: ["KEYHOLD_ASKPASS", "GIT_ASKPASS"])
    }

    /// Failures that should leave git to prompt, each said once on stderr.
    static func declined(_ error: KeyholdError, _ service: String, _ what: String) throws(KeyholdError) {
        switch error {
        case .interactionNotAllowed:
            HelperInput.complain(name, "\(service) needs authentication and there is no terminal, KEYHOLD_ASKPASS or GIT_ASKPASS; \(what)")
        case .notFound:
            break
        case .userCanceled, .authenticationFailed, .lockedOut, .invalidated, .notAuthorized:
            HelperInput.complain(name, "\(service): \(error.description); \(what)")
        default:
            throw error
        }
    }

    /// The account a request names: its username, else the only one stored for the host (an
    /// expired one skipped unreleased). Listing the vault happens only without a username.
    static func account(_ vault: Vault, _ service: String, _ request: GitCredential) throws(KeyholdError) -> String? {
        if let u = request.username, !u.isEmpty { return u }
        guard let item = try item(vault, service, nil) else { return nil }
        if let expiry = CredentialMapping.expiry(of: item), expiry <= CredentialMapping.now() { return nil }
        return item.account
    }

    static func get(_ vault: Vault, _ service: String, _ request: GitCredential) throws(KeyholdError) {
        guard let account = try account(vault, service, request) else { return }
        // Asked by username: the item's own expiry is checked (no prompt) before anything is
        // released, so an expired credential is not even opened.
        if request.username?.isEmpty == false, try vault.itemStatus(service: service, account: account).state == .expired { return }
        let released: ReleasedSecret
        do throws(KeyholdError) {
            released = try vault.release(service: service, account: account, reason: "git credential get", interaction: interaction())
        } catch {
            try declined(error, service, "git will ask instead")
            return
        }
        let secret = released.secret
        defer { secret.wipe() }
        let (password, refresh, legacyExpiry) = CredentialMapping.gitCredential(fromSecret: secret)
        defer { password.wipe(); refresh?.wipe() }
        let expiry = released.expires.map(CredentialMapping.seconds) ?? legacyExpiry
        if let expiry, expiry <= CredentialMapping.now() { return }  // git would reject it anyway
        guard let reply = GitCredentialProtocol.reply(username: account, password: password, expiry: expiry, refreshToken: refresh) else {
            HelperInput.complain(name, "\(service): the stored secret holds a newline or NUL and cannot be passed to git")
            return
        }
        defer { reply.wipe() }
        guard HelperInput.write(1, reply) else { throw .other("could not write to standard output") }
    }

    static func store(_ vault: Vault, _ service: String, _ request: GitCredential, access: AccessControl) throws(KeyholdError) -> Int32 {
        guard let username = request.username, !username.isEmpty, let password = request.password else {
            return fail("store needs protocol, host, username and password; nothing stored", .usage)
        }
        if let expiry = request.passwordExpiryUTC, expiry <= CredentialMapping.now() { return 0 }
        // The expiry is the item's own (authenticated, shown by `keyhold ls`/`state`), never
        // part of the secret or the label.
        let secret = CredentialMapping.gitSecret(password: password, refreshToken: request.oauthRefreshToken)
        defer { secret.wipe() }
        let kind: ItemKind = request.oauthRefreshToken != nil ? .refreshToken : .password
        let label = CredentialMapping.gitLabel
        let expires = request.passwordExpiryUTC.map(CredentialMapping.microseconds)
        do throws(KeyholdError) {
            try vault.add(secret, service: service, account: username, label: label, kind: kind, access: access, expires: expires)
            return 0
        } catch .duplicateItem {
            // git stores after every success, also of a credential this helper just gave it.
        }
        let current: ReleasedSecret
        do throws(KeyholdError) {
            current = try vault.release(service: service, account: username, reason: "git credential store", interaction: nil)
        } catch .interactionNotAllowed {
            // A gated item cannot be compared without a second prompt; it stays as it is
            // (README: `keyhold put --update` replaces it).
            return 0
        }
        defer { current.secret.wipe() }
        if current.secret.constantTimeEquals(secret) && current.expires == expires { return 0 }
        guard let existing = try item(vault, service, username) else { return 0 }
        try vault.update(secret, service: service, account: username, label: label, kind: kind,
                         access: CredentialMapping.access(of: existing) ?? access, reason: "git credential store",
                         expires: expires)
        return 0
    }

    static func erase(_ vault: Vault, _ service: String, _ request: GitCredential) throws(KeyholdError) {
        guard let account = try account(vault, service, request) else { return }
        let prompt = interaction()
        if let rejected = request.password {
            // Only the password git reports as rejected is erased: a reject carrying a stale
            // password never deletes a newer one stored meanwhile.
            let secret: SecureBytes
            do throws(KeyholdError) {
                secret = try vault.secret(service: service, account: account, reason: "git credential erase", interaction: prompt)
            } catch {
                try declined(error, service, "the stored credential was kept")
                return
            }
            let (stored, refresh, _) = CredentialMapping.gitCredential(fromSecret: secret)
            secret.wipe()
            refresh?.wipe()
            defer { stored.wipe() }
            guard stored.constantTimeEquals(rejected) else { return }
        }
        do throws(KeyholdError) {
            try CredentialMapping.delete(vault, service: service, account: account, interaction: prompt)
        } catch {
            try declined(error, service, "the stored credential was kept")
        }
    }
}
