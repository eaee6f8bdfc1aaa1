import CSystemd
import Glibc
import KeyholdClient
import KeyholdCore
import KeyholdProtocol

/// The Secret Service on the bus: resolves each call's object, checks its arguments, and
/// forwards to the broker as this user. Only the event loop's thread touches it and the bus;
/// a running prompt's authentication is on its own thread and hands back a `PromptOutcome`.
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
    /// Introspect, once the caller is confirmed).
    func dispatch(_ m: OpaquePointer) throws(BusError) -> Bool {
        guard let p = sd_bus_message_get_path(m), let mem = sd_bus_message_get_member(m) else { return false }
        let path = String(cString: p), member = String(cString: mem)
        let interface = sd_bus_message_get_interface(m).map { String(cString: $0) }
        let sender = sd_bus_message_get_sender(m).map { String(cString: $0) } ?? ""
        let claim = try confirmedClaim(sender: sender, member: member, path: path)
        if interface == "org.freedesktop.DBus.Introspectable" { return false }
        guard let object = SecretObject.resolve(path) else { throw .unknownObject("no object at \(path)") }
        let call = Call(m: m, r: MessageReader(m: m), sender: sender, member: member, claim: claim)
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
            try reply(m) { _ in }
            return true
        case .prompt(let pp):
            guard interface == nil || interface == Interface.prompt else { break }
            try promptMethod(pp, call)
            return true
        }
        throw .unknownMethod("no method \(interface ?? "").\(member) at \(path)")
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

    func signal(_ path: String, _ interface: String, _ member: String, _ body: (MessageWriter) -> Void) {
        var out: OpaquePointer?
        guard sd_bus_message_new_signal(bus, &out, path, interface, member) >= 0, let out else { return }
        body(MessageWriter(m: out))
        _ = sd_bus_send(bus, out, nil)
        sd_bus_message_unref(out)
    }

    // MARK: items from the broker

    func refreshItems(claim: Int32) throws(BusError) {
        do throws(KeyholdError) {
            let list = try vault.items(claimedPID: claim)
            var byID: [String: ItemInfo] = [:]
            for i in list { byID[i.id] = i }
            state.items = byID
            state.listedAt = MonotonicClock.milliseconds()
        } catch {
            throw Self.busError(error)
        }
    }

    /// How old the listing must be before a path missing from it lists the items again. A
    /// client that learned a path from this agent (a search, the collection's `Items`, its own
    /// `CreateItem`) finds it in the listing; a same-user client probing made-up paths would
    /// otherwise cost the broker a full listing, and the log a `list` entry, per probe.
    static let relistAfterMilliseconds: Int64 = 1_000

    /// The item at `id`: from the last listing, or from a new one when that is old enough.
    func item(_ id: String, claim: Int32) throws(BusError) -> ItemInfo {
        if let i = state.items[id] { return i }
        if let at = state.listedAt, MonotonicClock.milliseconds() - at < Self.relistAfterMilliseconds { throw .noSuchObject }
        try refreshItems(claim: claim)
        guard let i = state.items[id] else { throw .noSuchObject }
        return i
    }

    func attributes(of i: ItemInfo) -> [String: String] {
        AttributeMapping.attributes(service: i.service, account: i.account)
    }

    /// Items whose attributes hold every pair of `query`, split by lock state. The broker
    /// searches (its keyed index, then an exact match of each sealed map): the agent no longer
    /// fetches the whole list for a lookup.
    func search(_ query: [String: String], claimedPID: Int32) throws(BusError) -> (unlocked: [String], locked: [String]) {
        var unlocked: [String] = [], locked: [String] = []
        for i in try searchBroker(query, claimedPID: claimedPID) {
            if state.isLocked(i) { locked.append(SecretObject.itemPath(i.id)) } else { unlocked.append(SecretObject.itemPath(i.id)) }
        }
        return (unlocked, locked)
    }

    /// The broker's answer for `query`, in creation order, and the cache brought up to date
    /// with it: it is current for this query, so a cached item that matched and is no longer
    /// returned was deleted or renamed (through the CLI, say) and is dropped.
    /// The search is audited with the D-Bus sender as its claimed requester.
    func searchBroker(_ query: [String: String], claimedPID: Int32) throws(BusError) -> [ItemInfo] {
        let found: [ItemInfo]
        do throws(KeyholdError) {
            found = try vault.search(attributes: query, claimedPID: claimedPID)
        } catch {
            throw Self.busError(error)
        }
        for (id, i) in state.items where AttributeMapping.matches(attributes(of: i), query) { state.items[id] = nil }
        for i in found { state.items[i.id] = i }
        return found.sorted { $0.createdAt < $1.createdAt }
    }

    /// The item stored under exactly this name, found by a search for its whole map.
    func item(named ref: ItemReference, claimedPID: Int32) throws(BusError) -> ItemInfo? {
        try searchBroker(AttributeMapping.attributes(service: ref.service, account: ref.account), claimedPID: claimedPID)
            .first { $0.service == ref.service && $0.account == ref.account }
    }

    /// The item's secret for `session`, or IsLocked. Never prompts: authentication happens in
    /// a Prompt, so no method call waits on a finger or a password.
    func secret(_ i: ItemInfo, session: SecretSession, claimedPID: Int32) throws(BusError) -> WireSecret {
        guard !state.isLocked(i) else { throw .isLocked }
        let s: SecureBytes
        do throws(KeyholdError) {
            s = try vault.secret(service: i.service, account: i.account, claimedPID: claimedPID)
        } catch .interactionNotAllowed {
            // The broker's window ended first: locked here too, and said so.
            if state.unlockedUntil.removeValue(forKey: i.id) != nil { announceLocked(i.id, true) }
            throw .isLocked
        } catch {
            throw Self.busError(error)
        }
        defer { s.wipe() }
        let (parameters, value) = try session.encode(s)
        return WireSecret(session: "", parameters: parameters, value: value,
                          contentType: LabelEncoding.decode(i.label).contentType)
    }

    static func busError(_ e: KeyholdError) -> BusError {
        switch e {
        case .notFound: .noSuchObject
        case .interactionNotAllowed, .userCanceled, .authenticationFailed, .lockedOut: .isLocked
        case .notAuthorized: .accessDenied("not authorized")
        case .invalidRequest(let m): .invalidArgs(m)
        case .duplicateItem: .failed("duplicate item")
        default: .failed(e.outcome.name)
        }
    }
}
