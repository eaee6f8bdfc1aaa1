import CSystemd
import Glibc
import KeyholdClient
import KeyholdCore
import KeyholdProtocol

/// The Secret Service on the bus: confirms each caller (CallerCheck.swift), resolves the
/// call's object, checks its arguments, and forwards to the broker as this user with the
/// caller's claim. Only the event loop's thread touches it and the bus; every broker request
/// runs on a thread of its own (a call's job: AgentJobs.swift; a running prompt's
/// authentication: AgentPrompts.swift) and hands its result back through the `LoopInbox`.
public final class Agent {
    let bus: OpaquePointer
    let vault: Vault
    let options: AgentOptions
    let state = AgentState()
    let inbox: LoopInbox
    let reporter = RefusalReporter()

    init(bus: OpaquePointer, options: AgentOptions, inbox: LoopInbox) {
        self.bus = bus
        self.options = options
        self.inbox = inbox
        self.vault = Vault(socketPath: options.socketPath)
    }

    // MARK: dispatch

    /// One method call. Returns false for a call that is not ours (sd-bus answers it: only
    /// Introspect, once the caller is confirmed). A call from a client whose earlier call is
    /// still being worked on waits for it (AgentJobs.swift).
    func dispatch(_ m: OpaquePointer) throws(BusError) -> Bool {
        guard let p = sd_bus_message_get_path(m), let mem = sd_bus_message_get_member(m) else { return false }
        let sender = sd_bus_message_get_sender(m).map { String(cString: $0) } ?? ""
        _ = try confirmedClaim(sender: sender, member: String(cString: mem), path: String(cString: p))
        if sd_bus_message_get_interface(m).map({ String(cString: $0) }) == "org.freedesktop.DBus.Introspectable" { return false }
        if state.isBusy(sender) {
            try state.wait(sender, HeldCall(m))
            return true
        }
        return try handle(m, sender: sender)
    }

    /// Resolves the call's object and runs its method. The caller is confirmed again: a call
    /// that waited may find its process gone.
    func handle(_ m: OpaquePointer, sender: String) throws(BusError) -> Bool {
        guard let p = sd_bus_message_get_path(m), let mem = sd_bus_message_get_member(m) else { return false }
        let path = String(cString: p), member = String(cString: mem)
        let interface = sd_bus_message_get_interface(m).map { String(cString: $0) }
        let claim = try confirmedClaim(sender: sender, member: member, path: path)
        guard let object = SecretObject.resolve(path) else { throw .unknownObject("no object at \(path)") }
        let call = Call(m: m, r: MessageReader(m: m), sender: sender, member: member, claim: claim)
        do throws(BusError) {
            return try route(object, interface, call)
        } catch .listingNeeded {
            try afterListing(call)
            return true
        }
    }

    func route(_ object: SecretObject, _ interface: String?, _ call: Call) throws(BusError) -> Bool {
        let member = call.member, sender = call.sender
        if interface == Interface.properties {
            try properties(object, call)
            return true
        }
        switch object {
        case .service:
            guard interface == nil || interface == Interface.service else { break }
            try serviceMethod(call)
            return true
        case .collection:
            guard interface == nil || interface == Interface.collection else { break }
            try collectionMethod(call)
            return true
        case .item(let id):
            guard interface == nil || interface == Interface.item else { break }
            try itemMethod(id, call)
            return true
        case .session(let sp):
            guard interface == nil || interface == Interface.session, member == "Close" else { break }
            try call.r.requireSignature("")
            guard state.sessions[sp]?.owner == sender else { throw .noSession }
            state.sessions[sp] = nil
            try reply(call.m) { _ in }
            return true
        case .prompt(let pp):
            guard interface == nil || interface == Interface.prompt else { break }
            try promptMethod(pp, call)
            return true
        }
        throw .unknownMethod("no method \(interface ?? "").\(member) at \(sd_bus_message_get_path(call.m).map { String(cString: $0) } ?? "")")
    }

    struct Call {
        let m: OpaquePointer
        let r: MessageReader
        let sender: String
        let member: String
        /// The sender's pid, confirmed as this user's process that connected (CallerCheck.swift):
        /// every broker request made for this call carries it.
        let claim: Int32
    }

    // MARK: replies and signals

    func reply(_ call: OpaquePointer, _ body: (MessageWriter) throws(BusError) -> Void) throws(BusError) {
        var out: OpaquePointer?
        guard sd_bus_message_new_method_return(call, &out) >= 0, let out else { throw .failed("cannot build a reply") }
        defer { sd_bus_message_unref(out) }
        try body(MessageWriter(m: out))
        _ = sd_bus_send(nil, out, nil)
    }

    /// An empty reply; false when it could not be queued (the caller is gone).
    func replyChecked(_ call: OpaquePointer) throws(BusError) -> Bool {
        var out: OpaquePointer?
        guard sd_bus_message_new_method_return(call, &out) >= 0, let out else { throw .failed("cannot build a reply") }
        defer { sd_bus_message_unref(out) }
        return sd_bus_send(nil, out, nil) >= 0
    }

    /// A signal, sent to this user's own clients only (those that called, by the bus's word on
    /// their uid), each its own copy: broadcast, it would tell any process a permissive bus
    /// admits which items exist and their labels as they change. `to`: these clients only.
    func signal(_ path: String, _ interface: String, _ member: String, to clients: [String]? = nil,
                _ body: (MessageWriter) -> Void) {
        let uid = getuid()
        for client in clients ?? state.clients.filter({ $0.value.uid == uid }).map(\.key) {
            var out: OpaquePointer?
            guard sd_bus_message_new_signal(bus, &out, path, interface, member) >= 0, let out else { return }
            defer { sd_bus_message_unref(out) }
            guard sd_bus_message_set_destination(out, client) >= 0 else { continue }
            body(MessageWriter(m: out))
            _ = sd_bus_send(bus, out, nil)
        }
    }

    // MARK: items from the broker

    /// The broker's whole listing becomes the cache. (The listing itself is made off the loop:
    /// AgentJobs.swift.)
    func applyListing(_ list: [ItemInfo]) {
        var byID: [String: ItemInfo] = [:]
        for i in list { byID[i.id] = i }
        state.items = byID
        state.listedAt = MonotonicClock.milliseconds()
    }

    /// How old the listing must be before a path missing from it lists the items again. A
    /// client that learned a path from this agent (a search, the collection's `Items`, its own
    /// `CreateItem`) finds it in the listing; a same-user client probing made-up paths would
    /// otherwise cost the broker a full listing, and the log a `list` entry, per probe.
    static let relistAfterMilliseconds: Int64 = 1_000

    /// The item at `id` from the last listing; nil when it is not there and that listing is
    /// recent. `.listingNeeded` when it is old: the call is then answered after a new listing
    /// (Agent.dispatch), never by waiting for one here.
    func cachedItem(_ id: String) throws(BusError) -> ItemInfo? {
        if let i = state.items[id] { return i }
        if let at = state.listedAt, MonotonicClock.milliseconds() - at < Self.relistAfterMilliseconds { return nil }
        throw .listingNeeded
    }

    func item(_ id: String) throws(BusError) -> ItemInfo {
        guard let i = try cachedItem(id) else { throw .noSuchObject }
        return i
    }

    func attributes(of i: ItemInfo) -> [String: String] {
        AttributeMapping.attributes(service: i.service, account: i.account)
    }

    /// Items whose attributes hold every pair of `query` (the broker searches: its keyed index,
    /// then an exact match of each sealed map, audited with the sender as claimed requester),
    /// split by lock state; answered from the loop once the search is done.
    func search(_ query: [String: String], _ c: Call, then answer: @escaping (_ unlocked: [String], _ locked: [String]) throws(BusError) -> Void) throws(BusError) {
        let vault = self.vault, claim = c.claim
        try offload(c, { () -> Result<[ItemInfo], BusError> in
            Self.brokerResult { () throws(KeyholdError) in try vault.search(attributes: query, claimedPID: claim) }
        }) { (found: Result<[ItemInfo], BusError>) throws(BusError) in
            var unlocked: [String] = [], locked: [String] = []
            for i in self.applySearch(query, try found.get()) {
                if self.state.isLocked(i, for: c.sender) { locked.append(SecretObject.itemPath(i.id)) } else { unlocked.append(SecretObject.itemPath(i.id)) }
            }
            try answer(unlocked, locked)
        }
    }

    /// The broker's answer for `query`, in creation order, and the cache brought up to date
    /// with it: it is current for this query, so a cached item that matched and is no longer
    /// returned was deleted or renamed (through the CLI, say) and is dropped.
    func applySearch(_ query: [String: String], _ found: [ItemInfo]) -> [ItemInfo] {
        for (id, i) in state.items where AttributeMapping.matches(attributes(of: i), query) { state.items[id] = nil }
        for i in found { state.items[i.id] = i }
        return found.sorted { $0.createdAt < $1.createdAt }
    }

    /// A broker call's result as the D-Bus error it maps to; run on a job's thread.
    static func brokerResult<T>(_ body: () throws(KeyholdError) -> T) -> Result<T, BusError> {
        do throws(KeyholdError) {
            return .success(try body())
        } catch {
            return .failure(busError(error))
        }
    }

    static func busError(_ e: KeyholdError) -> BusError {
        switch e {
        case .notFound: .noSuchObject
        case .interactionNotAllowed, .userCanceled, .authenticationFailed, .lockedOut: .isLocked
        case .notAuthorized: .accessDenied("not authorized")
        case .invalidRequest(let m): .invalidArgs(m)
        case .duplicateItem: .failed("duplicate item")
        case .busy: .limitsExceeded("the broker is busy with this user's requests; try again shortly")
        default: .failed(e.outcome.name)
        }
    }
}
