import CSystemd
import Glibc
import KeyholdClient
import KeyholdCore
import KeyholdProtocol
import Synchronization

/// A method call whose reply comes later, from the loop: holds a reference to the message.
final class HeldCall {
    let m: OpaquePointer
    init(_ m: OpaquePointer) {
        self.m = m
        sd_bus_message_ref(m)
    }
    deinit { sd_bus_message_unref(m) }
}

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

    let job: Int
    let found: [Found]
    let relocked: [String]
}

/// One GetSecrets's broker reads, on its own thread: one `get` per distinct item, each as the
/// client's claim. Waits on the broker (and its *busy* retries) happen here, never on the
/// event loop, so one client naming thousands of paths delays only itself.
struct SecretsJob: Sendable {
    struct Target: Sendable {
        let id: String
        let service: String
        let account: String
    }

    let job: Int
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
        return SecretsOutcome(job: job, found: found, relocked: relocked)
    }
}

extension Agent {
    /// GetSecrets: the paths are resolved on the loop (from the listing; locked items are left
    /// out, as the specification says), each item once however often it is named; the reads run
    /// on a thread, and the reply is sent when they are done. A client may have
    /// `AgentState.maxReadsPerClient` such calls running, the agent `maxReads`.
    func getSecrets(_ c: Call) throws(BusError) {
        try c.r.requireSignature("aoo")
        let paths = try c.r.objectPaths(limit: Self.maxObjects)
        let sessionPath = try c.r.objectPath()
        let session = try state.session(sessionPath, sender: c.sender)
        var targets: [SecretsJob.Target] = [], seen: Set<String> = []
        for path in paths {
            guard case .item(let id)? = SecretObject.resolve(path), seen.insert(id).inserted,
                  let i = try? item(id, claim: c.claim), !state.isLocked(i) else { continue }
            targets.append(.init(id: id, service: i.service, account: i.account))
        }
        guard !targets.isEmpty else { return try reply(c.m) { w in w.open(UInt8(ascii: "a"), "{o(oayays)}"); w.close() } }
        let cancel = PromptCancel()
        let job = try state.addRead(AgentState.RunningRead(owner: c.sender, call: HeldCall(c.m), session: sessionPath,
                                                           contentTypes: Dictionary(targets.map { ($0.id, contentType(of: $0.id)) },
                                                                                    uniquingKeysWith: { a, _ in a }),
                                                           cancel: cancel))
        let work = SecretsJob(job: job, targets: targets, claim: c.claim, vault: vault, session: LentSession(session: session), cancel: cancel)
        let inbox = self.inbox
        guard DetachedThread.start({ inbox.post(.secrets(work.run())) }) else {
            state.reads[job] = nil
            throw .failed("cannot start the read")
        }
    }

    func contentType(of id: String) -> String {
        state.items[id].map { LabelEncoding.decode($0.label).contentType } ?? ""
    }

    /// On the loop thread: the reply, in the order the paths were first named. Dropped when the
    /// client left meanwhile.
    func finishSecrets(_ outcome: SecretsOutcome) {
        guard let read = state.reads.removeValue(forKey: outcome.job) else { return }
        for id in outcome.relocked where state.unlockedUntil.removeValue(forKey: id) != nil { announceLocked(id, true) }
        try? reply(read.call.m) { w in
            w.open(UInt8(ascii: "a"), "{o(oayays)}")
            for f in outcome.found {
                w.open(UInt8(ascii: "e"), "o(oayays)")
                w.objectPath(SecretObject.itemPath(f.id))
                w.secret(WireSecret(session: read.session, parameters: f.parameters, value: f.value,
                                    contentType: read.contentTypes[f.id] ?? ""))
                w.close()
            }
            w.close()
        }
    }
}
