import CSystemd
import KeyholdClient
import KeyholdCore
import KeyholdProtocol

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

    /// (interface, properties) of an object.
    func propertyValues(_ object: SecretObject, claim: Int32) throws(BusError) -> (String, [(String, Value)]) {
        switch object {
        case .service:
            return (Interface.service, [("Collections", .paths([SecretObject.collectionPath]))])
        case .collection:
            try refreshItems(claim: claim)
            return (Interface.collection, collectionValues())
        case .item(let id):
            return (Interface.item, itemValues(try item(id, claim: claim)))
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

    func itemValues(_ i: ItemInfo) -> [(String, Value)] {
        [
            ("Locked", .bool(state.isLocked(i))), ("Attributes", .map(attributes(of: i))),
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
            let (own, values) = try propertyValues(object, claim: c.claim)
            guard iface.isEmpty || iface == own, let v = values.first(where: { $0.0 == name })?.1 else {
                throw .invalidArgs("no property \(iface).\(name)")
            }
            try reply(c.m) { w in v.write(w) }
        case "GetAll":
            try c.r.requireSignature("s")
            let iface = try c.r.string()
            let (own, values) = try propertyValues(object, claim: c.claim)
            let shown = iface.isEmpty || iface == own ? values : []
            try reply(c.m) { w in
                w.open(UInt8(ascii: "a"), "{sv}")
                for (k, v) in shown {
                    w.open(UInt8(ascii: "e"), "sv")
                    w.string(k)
                    v.write(w)
                    w.close()
                }
                w.close()
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
        let i = try item(id, claim: c.claim)
        guard !state.isLocked(i) else { throw .isLocked }
        let policy: Policy
        do throws(Policy.ParseError) { policy = try Policy(parsing: i.policy) } catch { throw .failed("unreadable policy") }
        let pid = c.claim
        do throws(KeyholdError) {
            let secret = try vault.secret(service: i.service, account: i.account, claimedPID: pid, reason: "relabel")
            defer { secret.wipe() }
            try vault.store(secret, service: i.service, account: i.account,
                            label: LabelEncoding.encode(label: label, contentType: LabelEncoding.decode(i.label).contentType),
                            policy: policy, reuseSeconds: i.reuseSeconds, allowedExecutables: i.allowedExecutables,
                            update: true, claimedPID: pid)
        } catch .interactionNotAllowed {
            throw .isLocked
        } catch {
            throw Self.busError(error)
        }
        state.items[id] = nil
        try reply(c.m) { _ in }
        announce(.changed, item: id, changedProperties: ["Label", "Modified"], claim: c.claim)
    }
}
