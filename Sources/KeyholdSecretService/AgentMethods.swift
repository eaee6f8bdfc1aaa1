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
            let (unlocked, locked) = try search(try c.r.stringMap(limit: AttributeMapping.maxPairs, maxBytes: Limits.maxTextBytes),
                                                claimedPID: c.claim)
            try reply(c.m) { w in w.objectPaths(unlocked); w.objectPaths(locked) }
        case "Unlock":
            try c.r.requireSignature("ao")
            try unlock(try c.r.objectPaths(limit: Self.maxObjects), c)
        case "Lock":
            try c.r.requireSignature("ao")
            var locked: [String] = [], changedLocks: [String] = []
            for path in try c.r.objectPaths(limit: Self.maxObjects) {
                if case .item(let id)? = SecretObject.resolve(path) {
                    let wasUnlocked = state.unlockedUntil[id].map { $0 > AgentState.now() } ?? false
                    state.unlockedUntil[id] = nil
                    if let i = try? item(id, claim: c.claim), state.isLocked(i) {
                        locked.append(path)
                        if wasUnlocked { changedLocks.append(id) }
                    }
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
            let (unlocked, locked) = try search(try c.r.stringMap(limit: AttributeMapping.maxPairs, maxBytes: Limits.maxTextBytes),
                                                claimedPID: c.claim)
            try reply(c.m) { w in w.objectPaths(unlocked + locked) }
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
            defer { secret.wipe() }
            var existing = try item(named: ref, claimedPID: c.claim)
            for attempt in 0..<2 {
                var policy = options.defaultPolicy
                if let existing {
                    do throws(Policy.ParseError) { policy = try Policy(parsing: existing.policy) } catch { throw .failed("unreadable policy") }
                }
                do throws(KeyholdError) {
                    try vault.store(secret, service: ref.service, account: ref.account,
                                    label: LabelEncoding.encode(label: label, contentType: wire.contentType),
                                    policy: policy,
                                    reuseSeconds: existing?.reuseSeconds ?? options.reuseSeconds,
                                    allowedExecutables: existing?.allowedExecutables ?? [],
                                    update: existing != nil, claimedPID: c.claim)
                    break
                } catch .duplicateItem where existing == nil && attempt == 0 {
                    // The index did not show it (its rows removed on disk): the whole list does.
                    try refreshItems(claim: c.claim)
                    existing = state.items.values.first { $0.service == ref.service && $0.account == ref.account }
                } catch {
                    throw Self.busError(error)
                }
            }
            guard let stored = try item(named: ref, claimedPID: c.claim) else {
                throw .failed("the item was not stored")
            }
            let path = SecretObject.itemPath(stored.id)
            try reply(c.m) { w in w.objectPath(path); w.objectPath("/") }
            if existing == nil {
                announce(.created, item: stored.id, listed: true, claim: c.claim)
            } else {
                announce(.changed, item: stored.id, changedProperties: ["Label", "Modified"], listed: true, claim: c.claim)
            }
        case "Delete":
            throw .notSupported("the login collection cannot be deleted")
        default:
            throw .unknownMethod("no method \(c.member) on a Collection")
        }
    }

    func itemMethod(_ id: String, _ c: Call) throws(BusError) {
        let i = try item(id, claim: c.claim)
        switch c.member {
        case "GetSecret":
            try c.r.requireSignature("o")
            let sessionPath = try c.r.objectPath()
            let session = try state.session(sessionPath, sender: c.sender)
            var s = try secret(i, session: session, claimedPID: c.claim)
            s.session = sessionPath
            try reply(c.m) { w in w.secret(s) }
        case "SetSecret":
            try c.r.requireSignature("(oayays)")
            let wire = try c.r.secret(maxValueBytes: Self.secretLimit)
            let session = try state.session(wire.session, sender: c.sender)
            guard !state.isLocked(i) else { throw .isLocked }
            let secret = try session.decode(parameters: wire.parameters, value: wire.value)
            defer { secret.wipe() }
            let policy: Policy
            do throws(Policy.ParseError) { policy = try Policy(parsing: i.policy) } catch { throw .failed("unreadable policy") }
            do throws(KeyholdError) {
                try vault.store(secret, service: i.service, account: i.account,
                                label: LabelEncoding.encode(label: LabelEncoding.decode(i.label).label, contentType: wire.contentType),
                                policy: policy, reuseSeconds: i.reuseSeconds,
                                allowedExecutables: i.allowedExecutables, update: true, claimedPID: c.claim)
            } catch {
                throw Self.busError(error)
            }
            state.items[id] = nil
            try reply(c.m) { _ in }
            announce(.changed, item: id, changedProperties: ["Modified"], claim: c.claim)
        case "Delete":
            try c.r.requireSignature("")
            do throws(KeyholdError) {
                try vault.delete(service: i.service, account: i.account, claimedPID: c.claim)
            } catch {
                throw Self.busError(error)
            }
            state.items[id] = nil
            state.unlockedUntil[id] = nil
            try reply(c.m) { w in w.objectPath("/") }
            announce(.deleted, item: id, claim: c.claim)
        default:
            throw .unknownMethod("no method \(c.member) on an Item")
        }
    }
}
