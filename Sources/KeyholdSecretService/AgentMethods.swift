import CSystemd
import Glibc
import KeyholdClient
import KeyholdCore
import KeyholdProtocol

/// Methods of Service, Collection, Item and Prompt. Each checks its signature first.
extension Agent {
    static let maxObjects = 10_000
    static let secretLimit = Limits.maxSecretBytes + 32  // room for AES padding

    func serviceMethod(_ c: Call) throws(BusError) {
        switch c.member {
        case "OpenSession":
            try c.r.requireSignature("sv")
            let algorithm = try c.r.string()
            guard let alg = SessionAlgorithm(rawValue: algorithm) else { throw .notSupported("algorithm \(algorithm) is not supported") }
            guard let sig = try c.r.enterVariant() else { throw .invalidArgs("expected a variant") }
            let session: SecretSession
            var output: [UInt8]?
            switch alg {
            case .plain:
                guard sig == "s" else { throw .invalidArgs("plain takes an empty string") }
                session = .plain()
            case .dh:
                guard sig == "ay" else { throw .invalidArgs("\(alg.rawValue) takes the public key as ay") }
                let (s, pub) = try SecretSession.negotiate(peerPublicKey: try c.r.bytes(limit: 128))
                session = s
                output = pub
            }
            let path = try state.addSession(owner: c.sender, session)
            try reply(c.m) { w in
                if let output { w.variant("ay") { w.bytes(output) } } else { w.variant("s") { w.string("") } }
                w.objectPath(path)
            }
        case "SearchItems":
            try c.r.requireSignature("a{ss}")
            try search(try c.r.stringMap(limit: AttributeMapping.maxPairs, maxBytes: Limits.maxTextBytes), c) { unlocked, locked throws(BusError) in
                try self.reply(c.m) { w in w.objectPaths(unlocked); w.objectPaths(locked) }
            }
        case "Unlock":
            try c.r.requireSignature("ao")
            try unlock(try c.r.objectPaths(limit: Self.maxObjects), c)
        case "Lock":
            try c.r.requireSignature("ao")
            var locked: [String] = [], changedLocks: [String] = []
            // Every item resolved before any is locked: a call answered after a new listing
            // (`.listingNeeded`) runs again from the start.
            var named: [(String, ItemInfo?)] = []
            for path in try c.r.objectPaths(limit: Self.maxObjects) {
                if case .item(let id)? = SecretObject.resolve(path) { named.append((path, try cachedItem(id))) }
            }
            for (path, i) in named {
                guard case .item(let id)? = SecretObject.resolve(path) else { continue }
                // Locked for every client that had it unlocked.
                let now = AgentState.now()
                let wasUnlocked = state.unlockedUntil.contains { $0.key.id == id && $0.value > now }
                state.unlockedUntil = state.unlockedUntil.filter { $0.key.id != id }
                if let i, state.isLocked(i, for: c.sender) {
                    locked.append(path)
                    if wasUnlocked { changedLocks.append(id) }
                }
            }
            try reply(c.m) { w in w.objectPaths(locked); w.objectPath("/") }
            for id in changedLocks { announceLocked(id, true) }
        case "GetSecrets":
            try getSecrets(c)
        case "ReadAlias":
            try c.r.requireSignature("s")
            let name = try c.r.string()
            try reply(c.m) { w in w.objectPath(["default", "login"].contains(name) ? SecretObject.collectionPath : "/") }
        case "SetAlias":
            try c.r.requireSignature("so")
            let name = try c.r.string(), path = try c.r.objectPath()
            // One collection: "default" already names it; nothing else can be aliased.
            guard name == "default", SecretObject.resolve(path) == .collection else {
                throw .notSupported("only the alias default, for the one collection, is supported")
            }
            try reply(c.m) { _ in }
        case "CreateCollection":
            try c.r.requireSignature("a{sv}s")
            // The one collection stands for any request: clients ask for "default" or "login".
            try reply(c.m) { w in w.objectPath(SecretObject.collectionPath); w.objectPath("/") }
        default:
            throw .unknownMethod("no method \(c.member) on the Service")
        }
    }

    func collectionMethod(_ c: Call) throws(BusError) {
        switch c.member {
        case "SearchItems":
            try c.r.requireSignature("a{ss}")
            try search(try c.r.stringMap(limit: AttributeMapping.maxPairs, maxBytes: Limits.maxTextBytes), c) { unlocked, locked throws(BusError) in
                try self.reply(c.m) { w in w.objectPaths(unlocked + locked) }
            }
        case "CreateItem":
            try c.r.requireSignature("a{sv}(oayays)b")
            var label = "", attributes: [String: String] = [:]
            guard try c.r.enter(UInt8(ascii: "a"), "{sv}") else { throw .invalidArgs("expected a{sv}") }
            var seen = 0
            while try c.r.enter(UInt8(ascii: "e"), "sv") {
                seen += 1
                guard seen <= 64 else { throw .limitsExceeded("too many properties") }
                let key = try c.r.string()
                let sig = try c.r.enterVariant()
                switch (key, sig) {
                case ("org.freedesktop.Secret.Item.Label", "s"?):
                    label = try c.r.string()
                    try c.r.exit()
                case ("org.freedesktop.Secret.Item.Attributes", "a{ss}"?):
                    attributes = try c.r.stringMap(limit: AttributeMapping.maxPairs, maxBytes: Limits.maxTextBytes)
                    try c.r.exit()
                case ("org.freedesktop.Secret.Item.Label", _?), ("org.freedesktop.Secret.Item.Attributes", _?):
                    throw .invalidArgs("\(key) has the wrong type")
                case (_, let other?):
                    try c.r.skip(other)  // properties this agent does not keep
                    try c.r.exit()
                case (_, nil):
                    throw .invalidArgs("expected a variant")
                }
                try c.r.exit()
            }
            try c.r.exit()
            let wire = try c.r.secret(maxValueBytes: Self.secretLimit)
            let replace = try c.r.bool()
            _ = replace  // the same attributes always name the same item: it is replaced either way
            guard label.utf8.count <= Limits.maxTextBytes - 256 else { throw .limitsExceeded("label too long") }
            let session = try state.session(wire.session, sender: c.sender)
            let ref: ItemReference
            do throws(AttributeMapping.MappingError) {
                ref = try AttributeMapping.reference(for: attributes)
            } catch {
                throw .limitsExceeded("attributes too large")
            }
            let secret = try session.decode(parameters: wire.parameters, value: wire.value)
            let request = StoreRequest(ref: ref, label: LabelEncoding.encode(label: label, contentType: wire.contentType),
                                       defaultPolicy: options.defaultPolicy, defaultReuse: options.reuseSeconds)
            let vault = self.vault, claim = c.claim
            try offload(c, { () -> Result<StoreRequest.Outcome, BusError> in
                defer { secret.wipe() }
                return request.run(secret, vault: vault, claim: claim)
            }) { (stored: Result<StoreRequest.Outcome, BusError>) throws(BusError) in
                let outcome = try stored.get()
                _ = self.applySearch(AttributeMapping.attributes(service: ref.service, account: ref.account), outcome.found)
                try self.reply(c.m) { w in w.objectPath(SecretObject.itemPath(outcome.stored.id)); w.objectPath("/") }
                if outcome.replaced {
                    self.announce(.changed, item: outcome.stored.id, changedProperties: ["Label", "Modified"])
                } else {
                    self.announce(.created, item: outcome.stored.id)
                }
            }
        case "Delete":
            throw .notSupported("the login collection cannot be deleted")
        default:
            throw .unknownMethod("no method \(c.member) on a Collection")
        }
    }

    func itemMethod(_ id: String, _ c: Call) throws(BusError) {
        let i = try item(id)
        let vault = self.vault, claim = c.claim
        switch c.member {
        case "GetSecret":
            try c.r.requireSignature("o")
            let sessionPath = try c.r.objectPath()
            let session = LentSession(session: try state.session(sessionPath, sender: c.sender))
            // Never prompts: authentication happens in a Prompt, so no call waits on a finger or a password.
            guard !state.isLocked(i, for: c.sender) else { throw .isLocked }
            try offload(c, { () -> Result<(parameters: [UInt8], value: [UInt8]), BusError> in
                Self.brokerResult { () throws(KeyholdError) in
                    try vault.secret(service: i.service, account: i.account, claimedPID: claim)
                }.flatMap { s in
                    defer { s.wipe() }
                    do throws(BusError) { return .success(try session.session.encode(s)) } catch { return .failure(error) }
                }
            }) { (read: Result<(parameters: [UInt8], value: [UInt8]), BusError>) throws(BusError) in
                guard case .success(let s) = read else {
                    if case .failure(.isLocked) = read { self.relock([id], for: c.sender) }
                    return try read.map { _ in () }.get()
                }
                try self.reply(c.m) { w in
                    w.secret(WireSecret(session: sessionPath, parameters: s.parameters, value: s.value,
                                        contentType: LabelEncoding.decode(i.label).contentType))
                }
            }
        case "SetSecret":
            try c.r.requireSignature("(oayays)")
            let wire = try c.r.secret(maxValueBytes: Self.secretLimit)
            let session = try state.session(wire.session, sender: c.sender)
            guard !state.isLocked(i, for: c.sender) else { throw .isLocked }
            let policy: Policy
            do throws(Policy.ParseError) { policy = try Policy(parsing: i.policy) } catch { throw .failed("unreadable policy") }
            let secret = try session.decode(parameters: wire.parameters, value: wire.value)
            let label = LabelEncoding.encode(label: LabelEncoding.decode(i.label).label, contentType: wire.contentType)
            try offload(c, { () -> Result<[ItemInfo]?, BusError> in
                defer { secret.wipe() }
                return Self.brokerResult { () throws(KeyholdError) in
                    try vault.store(secret, service: i.service, account: i.account, label: label, policy: policy,
                                    reuseSeconds: i.reuseSeconds, allowedExecutables: i.allowedExecutables, update: true,
                                    claimedPID: claim)
                    return try? vault.items(claimedPID: claim)  // for the change signals' values
                }
            }) { (stored: Result<[ItemInfo]?, BusError>) throws(BusError) in
                let listing = try stored.get()
                self.state.items[id] = nil
                if let listing { self.applyListing(listing) }
                try self.reply(c.m) { _ in }
                self.announce(.changed, item: id, changedProperties: ["Modified"], fresh: listing != nil)
            }
        case "Delete":
            try c.r.requireSignature("")
            try offload(c, { () -> Result<[ItemInfo]?, BusError> in
                Self.brokerResult { () throws(KeyholdError) in
                    try vault.delete(service: i.service, account: i.account, claimedPID: claim)
                    return try? vault.items(claimedPID: claim)
                }
            }) { (deleted: Result<[ItemInfo]?, BusError>) throws(BusError) in
                let listing = try deleted.get()
                self.state.items[id] = nil
                self.state.unlockedUntil = self.state.unlockedUntil.filter { $0.key.id != id }
                if let listing { self.applyListing(listing) }
                try self.reply(c.m) { w in w.objectPath("/") }
                self.announce(.deleted, item: id, fresh: listing != nil)
            }
        default:
            throw .unknownMethod("no method \(c.member) on an Item")
        }
    }
}

/// CreateItem's broker work, on its job's thread: the item stored under exactly this name
/// (found by a search for its whole map) is replaced under its own policy, else a new one is
/// stored under the agent's default; then the search again, for the stored item's metadata.
struct StoreRequest: Sendable {
    let ref: ItemReference
    let label: String
    let defaultPolicy: Policy
    let defaultReuse: UInt32

    struct Outcome {
        let stored: ItemInfo
        let replaced: Bool
        /// The search's answer after the store (the cache is brought up to date with it).
        let found: [ItemInfo]
    }

    func run(_ secret: SecureBytes, vault: Vault, claim: Int32) -> Result<Outcome, BusError> {
        let query = AttributeMapping.attributes(service: ref.service, account: ref.account)
        func named() throws(KeyholdError) -> (ItemInfo?, [ItemInfo]) {
            let found = try vault.search(attributes: query, claimedPID: claim)
            return (found.first { $0.service == ref.service && $0.account == ref.account }, found)
        }
        do throws(KeyholdError) {
            var existing = try named().0
            for attempt in 0..<2 {
                var policy = defaultPolicy
                if let existing {
                    do throws(Policy.ParseError) { policy = try Policy(parsing: existing.policy) } catch { return .failure(.failed("unreadable policy")) }
                }
                do throws(KeyholdError) {
                    try vault.store(secret, service: ref.service, account: ref.account, label: label, policy: policy,
                                    reuseSeconds: existing?.reuseSeconds ?? defaultReuse,
                                    allowedExecutables: existing?.allowedExecutables ?? [],
                                    update: existing != nil, claimedPID: claim)
                    break
                } catch .duplicateItem where existing == nil && attempt == 0 {
                    // The index did not show it (its rows removed on disk): the whole list does.
                    existing = try vault.items(claimedPID: claim).first { $0.service == ref.service && $0.account == ref.account }
                }
            }
            let (stored, found) = try named()
            guard let stored else { return .failure(.failed("the item was not stored")) }
            return .success(Outcome(stored: stored, replaced: existing != nil, found: found))
        } catch {
            return .failure(Agent.busError(error))
        }
    }
}
