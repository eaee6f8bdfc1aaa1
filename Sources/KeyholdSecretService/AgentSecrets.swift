import CSystemd
import Glibc
import KeyholdClient
import KeyholdCore
import KeyholdProtocol

/// A session's key lent to a read thread. The key is only read (each secret is encrypted
/// under a fresh IV), and a session closed meanwhile is kept alive by this reference.
struct LentSession: @unchecked Sendable {
    let session: SecretSession
}

/// What a GetSecrets's thread read: each released secret encoded for the client's session, and
/// the items the broker found locked (their reuse window ended first).
struct SecretsOutcome: Sendable {
    struct Found: Sendable {
        let id: String
        let parameters: [UInt8]
        let value: [UInt8]
    }

    let found: [Found]
    let relocked: [String]
}

/// One GetSecrets's broker reads, on its job's thread: one `get` per distinct item, each as the
/// client's claim; stops when the client leaves.
struct SecretsJob: Sendable {
    struct Target: Sendable {
        let id: String
        let service: String
        let account: String
    }

    let targets: [Target]
    let claim: Int32
    let vault: Vault
    let session: LentSession
    let cancel: PromptCancel

    func run() -> SecretsOutcome {
        var found: [SecretsOutcome.Found] = [], relocked: [String] = []
        for t in targets where !cancel.isCanceled {
            do throws(KeyholdError) {
                let s = try vault.secret(service: t.service, account: t.account, claimedPID: claim)
                defer { s.wipe() }
                guard let (parameters, value) = try? session.session.encode(s) else { continue }
                found.append(.init(id: t.id, parameters: parameters, value: value))
            } catch .interactionNotAllowed {
                relocked.append(t.id)
            } catch {
                continue  // refused items are left out, as the specification says
            }
        }
        return SecretsOutcome(found: found, relocked: relocked)
    }
}

extension Agent {
    /// GetSecrets: the paths are resolved on the loop (from the listing; locked items are left
    /// out, as the specification says), each item once however often it is named; the reads
    /// run as the client's job, and the reply lists them in the order first named.
    func getSecrets(_ c: Call) throws(BusError) {
        try c.r.requireSignature("aoo")
        let paths = try c.r.objectPaths(limit: Self.maxObjects)
        let sessionPath = try c.r.objectPath()
        let session = try state.session(sessionPath, sender: c.sender)
        var targets: [SecretsJob.Target] = [], seen: Set<String> = [], contentTypes: [String: String] = [:]
        for path in paths {
            guard case .item(let id)? = SecretObject.resolve(path), seen.insert(id).inserted,
                  let i = try cachedItem(id), !state.isLocked(i, for: c.sender) else { continue }
            targets.append(.init(id: id, service: i.service, account: i.account))
            contentTypes[id] = LabelEncoding.decode(i.label).contentType
        }
        guard !targets.isEmpty else { return try reply(c.m) { w in w.open(UInt8(ascii: "a"), "{o(oayays)}"); w.close() } }
        let cancel = PromptCancel()
        let work = SecretsJob(targets: targets, claim: c.claim, vault: vault, session: LentSession(session: session), cancel: cancel)
        try offload(c, cancel: cancel, { work.run() }) { (outcome: SecretsOutcome) throws(BusError) in
            self.relock(outcome.relocked, for: c.sender)
            try self.reply(c.m) { w in
                w.open(UInt8(ascii: "a"), "{o(oayays)}")
                for f in outcome.found {
                    w.open(UInt8(ascii: "e"), "o(oayays)")
                    w.objectPath(SecretObject.itemPath(f.id))
                    w.secret(WireSecret(session: sessionPath, parameters: f.parameters, value: f.value,
                                        contentType: contentTypes[f.id] ?? ""))
                    w.close()
                }
                w.close()
            }
        }
    }

    /// Items the broker found locked for `client` (their reuse window ended first): locked here
    /// too, and said so.
    func relock(_ ids: [String], for client: String) {
        for id in ids where state.unlockedUntil.removeValue(forKey: AgentState.Unlock(client: client, id: id)) != nil {
            announceLocked(id, true, to: [client])
        }
    }
}
