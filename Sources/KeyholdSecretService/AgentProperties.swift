import CSystemd
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
    func propertyValues(_ object: SecretObject) throws(BusError) -> (String, [(String, Value)]) {
        switch object {
        case .service:
            return (Interface.service, [("Collections", .paths([SecretObject.collectionPath]))])
        case .collection:
            try refreshItems()
            let items = state.items.values.sorted { $0.createdAt < $1.createdAt }
            let modified = items.map(\.updatedAt).max() ?? 0
            return (Interface.collection, [
                ("Items", .paths(items.map { SecretObject.itemPath($0.id) })), ("Label", .string("Login")),
                ("Locked", .bool(false)), ("Created", .uint64(0)), ("Modified", .uint64(UInt64(max(0, modified / 1_000_000)))),
            ])
        case .item(let id):
            let i = try item(id)
            return (Interface.item, [
                ("Locked", .bool(state.isLocked(i))), ("Attributes", .map(attributes(of: i))),
                ("Label", .string(LabelEncoding.decode(i.label).label)), ("Type", .string("")),
                ("Created", .uint64(UInt64(max(0, i.createdAt / 1_000_000)))),
                ("Modified", .uint64(UInt64(max(0, i.updatedAt / 1_000_000)))),
            ])
        case .session:
            return (Interface.session, [])
        case .prompt:
            return (Interface.prompt, [])
        }
    }

    func properties(_ object: SecretObject, _ c: Call) throws(BusError) {
        switch c.member {
        case "Get":
            try c.r.requireSignature("ss")
            let iface = try c.r.string(), name = try c.r.string()
            let (own, values) = try propertyValues(object)
            guard iface.isEmpty || iface == own, let v = values.first(where: { $0.0 == name })?.1 else {
                throw .invalidArgs("no property \(iface).\(name)")
            }
            try reply(c.m) { w in v.write(w) }
        case "GetAll":
            try c.r.requireSignature("s")
            let iface = try c.r.string()
            let (own, values) = try propertyValues(object)
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
            throw .notSupported("properties are read-only through this agent")
        default:
            throw .unknownMethod("no method \(c.member) on Properties")
        }
    }
}
