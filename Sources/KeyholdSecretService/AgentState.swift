import Glibc
import KeyholdClient
import KeyholdCore
import KeyholdProtocol

public struct AgentOptions: Sendable {
    public var socketPath: String?
    /// Policy of items created through the agent. "none": clients such as python keyring and
    /// GNOME applications read at start-up without a window to prompt in; the read is still
    /// audited, and a stricter default (e.g. "user-presence") gates every such item.
    public var defaultPolicy: Policy = .none
    /// Reuse window of items created through the agent, and how long an unlocked item stays so.
    public var reuseSeconds: UInt32 = 60
    public var replace = false
    public init() {}
}

/// Bookkeeping of the agent: sessions, prompts, the item list it last read, what is unlocked.
/// Holds no secret: only metadata and session keys.
///
/// Every kind of entry a client can make has a cap per client (connection), far below the
/// agent's, and the agent's is shared fairly: when it is reached, a client holding fewer
/// entries than the biggest holder gets its entry in place of that holder's oldest. So one
/// client, or many connections of one program, cannot refuse the others (the agent serves only
/// its own user: its cap is the uid's).
final class AgentState {
    static let maxSessions = 1024
    static let maxSessionsPerClient = 64
    static let maxPrompts = 256
    static let maxPromptsPerClient = 16
    /// Calls whose broker work runs at once, each on its own thread (one per client), and the
    /// calls a client may have waiting behind its running one.
    static let maxJobs = 256
    static let maxQueuedPerClient = 32
    /// Prompts whose authentication runs at once, each on its own thread; per client, so one
    /// client cannot hold every slot.
    static let maxRunningPrompts = 8
    static let maxRunningPromptsPerClient = 2

    struct SessionEntry {
        let owner: String
        let session: SecretSession
        let serial: Int
    }

    struct PromptEntry {
        let owner: String
        let itemIDs: [String]
        let serial: Int
    }

    /// A call whose broker work runs on a thread (AgentJobs.swift).
    struct Job {
        let owner: String
        let call: HeldCall
        let cancel: PromptCancel
        let finish: (Any) throws(BusError) -> Void
    }

    /// A prompt whose authentication runs on its thread (no longer in `prompts`).
    struct RunningPrompt {
        let owner: String
        let cancel: PromptCancel
    }

    /// Credentials of the connections that called, by unique name (CallerCheck.swift); an
    /// entry goes when its connection leaves the bus.
    var clients: [String: ClientCredentials] = [:]
    static let maxClients = 4096
    var sessions: [String: SessionEntry] = [:]
    var prompts: [String: PromptEntry] = [:]
    var running: [String: RunningPrompt] = [:]
    var jobs: [Int: Job] = [:]
    /// Calls that arrived while their client's job ran, in order.
    var waiting: [String: [HeldCall]] = [:]
    private var nextSession = 1
    private var nextPrompt = 1
    private var nextJob = 1
    /// Orders entries by age, for the fair share.
    private var serial = 0
    /// Metadata of the caller's items by id, from the last listing.
    var items: [String: ItemInfo] = [:]
    /// When that listing was made (monotonic ms; nil before the first).
    var listedAt: Int64?
    /// Item id -> µs until which it counts as unlocked (after a prompt passed its policy).
    var unlockedUntil: [Unlock: Int64] = [:]

    /// An item unlocked for one client, by the prompt it ran: the broker holds the grant, for
    /// that client's process and that item only (ClaimedGrant), so the agent's state is kept
    /// the same way — another client sees the item locked and needs its own prompt.
    struct Unlock: Hashable {
        let client: String
        let id: String
    }

    func addSession(owner: String, _ session: SecretSession) throws(BusError) -> String {
        guard sessions.values.filter({ $0.owner == owner }).count < Self.maxSessionsPerClient else {
            throw .limitsExceeded("too many sessions for this client")
        }
        if sessions.count >= Self.maxSessions {
            guard let evicted = Self.fairShare(sessions.mapValues { ($0.owner, $0.serial) }, for: owner) else {
                throw .limitsExceeded("too many sessions")
            }
            sessions[evicted] = nil
        }
        let path = SecretObject.sessionPrefix + String(nextSession)
        nextSession = nextSession >= 999_999_999 ? 1 : nextSession + 1
        serial += 1
        sessions[path] = SessionEntry(owner: owner, session: session, serial: serial)
        return path
    }

    /// With the agent's cap reached: the oldest entry of the client holding the most, when
    /// `owner` holds fewer than it; nil when `owner` is (one of) the biggest holders.
    static func fairShare(_ entries: [String: (owner: String, serial: Int)], for owner: String) -> String? {
        var held: [String: Int] = [:]
        for e in entries.values { held[e.owner, default: 0] += 1 }
        guard let biggest = held.max(by: { $0.value < $1.value }), biggest.value > (held[owner] ?? 0) + 1 else { return nil }
        return entries.filter { $0.value.owner == biggest.key }.min { $0.value.serial < $1.value.serial }?.key
    }

    /// The session at `path`, if `sender` opened it.
    func session(_ path: String, sender: String) throws(BusError) -> SecretSession {
        guard let s = sessions[path], s.owner == sender else { throw .noSession }
        return s.session
    }

    /// A new prompt, and the one it displaced from the biggest holder (to be told it is dismissed).
    func addPrompt(owner: String, itemIDs: [String]) throws(BusError) -> (path: String, evicted: (path: String, owner: String)?) {
        guard prompts.values.filter({ $0.owner == owner }).count < Self.maxPromptsPerClient else {
            throw .limitsExceeded("too many prompts for this client")
        }
        var evicted: (path: String, owner: String)?
        if prompts.count >= Self.maxPrompts {
            guard let e = Self.fairShare(prompts.mapValues { ($0.owner, $0.serial) }, for: owner) else {
                throw .limitsExceeded("too many prompts")
            }
            evicted = prompts.removeValue(forKey: e).map { (e, $0.owner) }
        }
        let path = SecretObject.promptPrefix + String(nextPrompt)
        nextPrompt = nextPrompt >= 999_999_999 ? 1 : nextPrompt + 1
        serial += 1
        prompts[path] = PromptEntry(owner: owner, itemIDs: itemIDs, serial: serial)
        return (path, evicted)
    }

    /// A job, within the cap (its thread is started by the caller). A client has one at a time.
    func addJob(_ job: Job) throws(BusError) -> Int {
        guard jobs.count < Self.maxJobs else { throw .limitsExceeded("too many calls in progress; try again") }
        let id = nextJob
        nextJob += 1
        jobs[id] = job
        return id
    }

    func hasJob(_ client: String) -> Bool { jobs.values.contains { $0.owner == client } }

    /// Whether a call of `client` must wait: its job runs, or earlier calls wait already.
    func isBusy(_ client: String) -> Bool { waiting[client] != nil || hasJob(client) }

    func wait(_ client: String, _ call: HeldCall) throws(BusError) {
        guard (waiting[client]?.count ?? 0) < Self.maxQueuedPerClient else {
            throw .limitsExceeded("too many calls waiting for this client; wait for the answers")
        }
        waiting[client, default: []].append(call)
    }

    func nextWaiting(_ client: String) -> HeldCall? {
        guard var queue = waiting[client], !queue.isEmpty else { return nil }
        let next = queue.removeFirst()
        waiting[client] = queue.isEmpty ? nil : queue
        return next
    }

    /// A client left the bus: its sessions and prompts go with it; its running prompts stop
    /// asking, and their outcomes are dropped when they come.
    func forget(client: String) {
        clients[client] = nil
        unlockedUntil = unlockedUntil.filter { $0.key.client != client }
        sessions = sessions.filter { $0.value.owner != client }
        prompts = prompts.filter { $0.value.owner != client }
        for (path, p) in running where p.owner == client {
            p.cancel.cancel()
            running[path] = nil
        }
        // Its jobs run to their end (their threads hold the agent-wide slots until then); a
        // GetSecrets stops reading. Their replies find no one.
        for j in jobs.values where j.owner == client { j.cancel.cancel() }
        waiting[client] = nil
    }

    static func now() -> Int64 { MonotonicClock.microseconds() }

    func isLocked(_ item: ItemInfo, for client: String) -> Bool {
        guard item.policy != Policy.none.description else { return false }
        return (unlockedUntil[Unlock(client: client, id: item.id)] ?? 0) <= Self.now()
    }
}
