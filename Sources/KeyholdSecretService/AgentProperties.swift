import CSystemd
import KeyholdClient
import KeyholdCore
import KeyholdProtocol

extension MessageWriter {
    /// `a{sv}`: property names and values (GetAll, PropertiesChanged).
    func properties(_ values: [(String, Agent.Value)]) {
        open(UInt8(ascii: "a"), "{sv}")
        for (name, value) in values {
            open(UInt8(ascii: "e"), "sv")
            string(name)
            value.write(self)
            close()
        }
        close()
    }
}

/// org.freedesktop.DBus.Properties for every object.
extension Agent {
    enum Value {
        case string(String), bool(Bool), uint64(UInt64), paths([String]), map([String: String])

        func write(_ w: MessageWriter) {
            switch self {
            case .string(let s): w.variant("s") { w.string(s) }
            case .bool(let b): w.variant("b") { w.bool(b) }
            case .uint64(let t): w.variant("t") { w.uint64(t) }
            case .paths(let p): w.variant("ao") { w.objectPaths(p) }
            case .map(let m): w.variant("a{ss}") { w.stringMap(m) }
            }
        }
    }

    /// (interface, properties) of an object, given to `answer`: the collection's once the
    /// items are listed again (off the loop), the others' at once.
    func withValues(_ object: SecretObject, _ c: Call,
                    _ answer: @escaping (String, [(String, Value)]) throws(BusError) -> Void) throws(BusError) {
        guard object == .collection else {
            let (own, values) = try propertyValues(object, for: c.sender)
            return try answer(own, values)
        }
        let vault = self.vault, claim = c.claim
        try offload(c, { () -> Result<[ItemInfo], BusError> in
            Self.brokerResult { () throws(KeyholdError) in try vault.items(claimedPID: claim) }
        }) { (listed: Result<[ItemInfo], BusError>) throws(BusError) in
            self.applyListing(try listed.get())
            try answer(Interface.collection, self.collectionValues())
        }
    }

    func propertyValues(_ object: SecretObject, for client: String) throws(BusError) -> (String, [(String, Value)]) {
        switch object {
        case .service:
            return (Interface.service, [("Collections", .paths([SecretObject.collectionPath]))])
        case .collection:
            return (Interface.collection, collectionValues())
        case .item(let id):
            return (Interface.item, itemValues(try item(id), for: client))
        case .session:
            return (Interface.session, [])
        case .prompt:
            return (Interface.prompt, [])
        }
    }

    /// The collection's properties from the item list last read (the caller refreshes it).
    func collectionValues() -> [(String, Value)] {
        let items = state.items.values.sorted { $0.createdAt < $1.createdAt }
        let modified = items.map(\.updatedAt).max() ?? 0
        return [
            ("Items", .paths(items.map { SecretObject.itemPath($0.id) })), ("Label", .string("Login")),
            ("Locked", .bool(false)), ("Created", .uint64(0)), ("Modified", .uint64(UInt64(max(0, modified / 1_000_000)))),
        ]
    }

    /// `Locked` as `client` sees it (nil: as a client that ran no prompt).
    func itemValues(_ i: ItemInfo, for client: String?) -> [(String, Value)] {
        [
            ("Locked", .bool(client.map { state.isLocked(i, for: $0) } ?? (i.policy != Policy.none.description))), ("Attributes", .map(attributes(of: i))),
            ("Label", .string(LabelEncoding.decode(i.label).label)), ("Type", .string("")),
            ("Created", .uint64(UInt64(max(0, i.createdAt / 1_000_000)))),
            ("Modified", .uint64(UInt64(max(0, i.updatedAt / 1_000_000)))),
        ]
    }

    func properties(_ object: SecretObject, _ c: Call) throws(BusError) {
        switch c.member {
        case "Get":
            try c.r.requireSignature("ss")
            let iface = try c.r.string(), name = try c.r.string()
            try withValues(object, c) { own, values throws(BusError) in
                guard iface.isEmpty || iface == own, let v = values.first(where: { $0.0 == name })?.1 else {
                    throw .invalidArgs("no property \(iface).\(name)")
                }
                try self.reply(c.m) { w in v.write(w) }
            }
        case "GetAll":
            try c.r.requireSignature("s")
            let iface = try c.r.string()
            try withValues(object, c) { own, values throws(BusError) in
                let shown = iface.isEmpty || iface == own ? values : []
                try self.reply(c.m) { w in w.properties(shown) }
            }
        case "Set":
            try c.r.requireSignature("ssv")
            let iface = try c.r.string(), name = try c.r.string()
            guard case .item(let id) = object, iface == Interface.item || iface.isEmpty, name == "Label" else {
                throw .notSupported("only an item's Label can be set")
            }
            guard try c.r.enterVariant() == "s" else { throw .invalidArgs("Label is a string") }
            let label = try c.r.string()
            try setLabel(id, label, c)
        default:
            throw .unknownMethod("no method \(c.member) on Properties")
        }
    }
}

extension Agent {
    /// A new label is a replacement of the item (the vault seals the label with it): the item's
    /// secret is read under its policy (no prompt: a locked item is IsLocked) and stored again
    /// with the same policy, reuse window and allowed executables.
    func setLabel(_ id: String, _ label: String, _ c: Call) throws(BusError) {
        guard label.utf8.count <= Limits.maxTextBytes - 256 else { throw .limitsExceeded("label too long") }
        let i = try item(id)
        guard !state.isLocked(i, for: c.sender) else { throw .isLocked }
        let policy: Policy
        do throws(Policy.ParseError) { policy = try Policy(parsing: i.policy) } catch { throw .failed("unreadable policy") }
        let vault = self.vault, claim = c.claim
        let sealedLabel = LabelEncoding.encode(label: label, contentType: LabelEncoding.decode(i.label).contentType)
        try offload(c, { () -> Result<[ItemInfo]?, BusError> in
            do throws(KeyholdError) {
                let secret = try vault.secret(service: i.service, account: i.account, claimedPID: claim, reason: "relabel")
                defer { secret.wipe() }
                try vault.store(secret, service: i.service, account: i.account, label: sealedLabel, policy: policy,
                                reuseSeconds: i.reuseSeconds, allowedExecutables: i.allowedExecutables, update: true, claimedPID: claim)
                return .success(try? vault.items(claimedPID: claim))
            } catch .interactionNotAllowed {
                return .failure(.isLocked)
            } catch {
                return .failure(Self.busError(error))
            }
        }) { (stored: Result<[ItemInfo]?, BusError>) throws(BusError) in
            let listing = try stored.get()
            self.state.items[id] = nil
            if let listing { self.applyListing(listing) }
            try self.reply(c.m) { _ in }
            self.announce(.changed, item: id, changedProperties: ["Label", "Modified"], fresh: listing != nil)
        }
    }
}
