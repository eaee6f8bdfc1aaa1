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
final class AgentState {
    static let maxSessions = 1024
    static let maxSessionsPerClient = 64
    static let maxPrompts = 256
    /// Prompts whose authentication runs at once, each on its own thread; per client, so one
    /// client cannot hold every slot.
    static let maxRunningPrompts = 8
    static let maxRunningPromptsPerClient = 2

    struct SessionEntry {
        let owner: String
        let session: SecretSession
    }

    struct PromptEntry {
        let owner: String
        let itemIDs: [String]
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
    private var nextSession = 1
    private var nextPrompt = 1
    /// Metadata of the caller's items by id, from the last listing.
    var items: [String: ItemInfo] = [:]
    /// When that listing was made (monotonic ms; nil before the first).
    var listedAt: Int64?
    /// Item id -> µs until which it counts as unlocked (after a prompt passed its policy).
    var unlockedUntil: [String: Int64] = [:]

    func addSession(owner: String, _ session: SecretSession) throws(BusError) -> String {
        guard sessions.count < Self.maxSessions else { throw .limitsExceeded("too many sessions") }
        guard sessions.values.filter({ $0.owner == owner }).count < Self.maxSessionsPerClient else {
            throw .limitsExceeded("too many sessions for this client")
        }
        let path = SecretObject.sessionPrefix + String(nextSession)
        nextSession = nextSession >= 999_999_999 ? 1 : nextSession + 1
        sessions[path] = SessionEntry(owner: owner, session: session)
        return path
    }

    /// The session at `path`, if `sender` opened it.
    func session(_ path: String, sender: String) throws(BusError) -> SecretSession {
        guard let s = sessions[path], s.owner == sender else { throw .noSession }
        return s.session
    }

    func addPrompt(owner: String, itemIDs: [String]) throws(BusError) -> String {
        guard prompts.count < Self.maxPrompts else { throw .limitsExceeded("too many prompts") }
        let path = SecretObject.promptPrefix + String(nextPrompt)
        nextPrompt = nextPrompt >= 999_999_999 ? 1 : nextPrompt + 1
        prompts[path] = PromptEntry(owner: owner, itemIDs: itemIDs)
        return path
    }

    /// A client left the bus: its sessions and prompts go with it; its running prompts stop
    /// asking, and their outcomes are dropped when they come.
    func forget(client: String) {
        clients[client] = nil
        sessions = sessions.filter { $0.value.owner != client }
        prompts = prompts.filter { $0.value.owner != client }
        for (path, p) in running where p.owner == client {
            p.cancel.cancel()
            running[path] = nil
        }
    }

    static func now() -> Int64 { MonotonicClock.microseconds() }

    func isLocked(_ item: ItemInfo) -> Bool {
        guard item.policy != Policy.none.description else { return false }
        return (unlockedUntil[item.id] ?? 0) <= Self.now()
    }
}
