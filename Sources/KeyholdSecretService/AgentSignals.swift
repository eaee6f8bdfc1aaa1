import CSystemd

/// Change notifications: the collection's Item* signals, the service's CollectionChanged and
/// org.freedesktop.DBus.Properties.PropertiesChanged, so clients that cache (KDE, browsers,
/// seahorse) see changes made by other clients.
///
/// Changed properties carry their values (as the specification and KeePassXC do): they come
/// from the items as read after the change (a listing made by the change's job, since the
/// broker sets Modified). Only if that failed are they sent as invalidated names, for the
/// client to re-read.
/// The one collection is never created or deleted, so CollectionCreated/Deleted never fire.
extension Agent {
    enum ItemEvent {
        case created, changed, deleted

        var member: String {
            switch self {
            case .created: "ItemCreated"
            case .changed: "ItemChanged"
            case .deleted: "ItemDeleted"
            }
        }
    }

    /// Announces a change of item `id`; `changedProperties` are the item's properties that
    /// changed (for `.changed`). `fresh`: the cached items were read after the change.
    func announce(_ event: ItemEvent, item id: String, changedProperties: [String] = [], fresh: Bool = true) {
        let path = SecretObject.itemPath(id)
        signal(SecretObject.collectionPath, Interface.collection, event.member) { $0.objectPath(path) }
        switch event {
        case .created, .deleted:
            changedValues(SecretObject.collectionPath, Interface.collection, ["Items", "Modified"], fresh ? collectionValues() : nil)
        case .changed:
            changedValues(path, Interface.item, changedProperties, fresh ? state.items[id].map { itemValues($0, for: nil) } : nil)
            changedValues(SecretObject.collectionPath, Interface.collection, ["Modified"], fresh ? collectionValues() : nil)
        }
        signal(SecretObject.servicePath, Interface.service, "CollectionChanged") { $0.objectPath(SecretObject.collectionPath) }
    }

    /// PropertiesChanged for `names`, with their values from `values` when known.
    func changedValues(_ path: String, _ interface: String, _ names: [String], _ values: [(String, Value)]?) {
        guard let values else { return propertiesChanged(path, interface, invalidated: names) }
        propertiesChanged(path, interface, changed: values.filter { names.contains($0.0) })
    }

    /// An item's lock state changed (unlocked by a prompt, locked by Lock, or its reuse window
    /// ended): its Locked property, and ItemChanged on the collection.
    /// `to`: the clients it changed for (nil: all).
    func announceLocked(_ id: String, _ locked: Bool, to clients: [String]? = nil) {
        let path = SecretObject.itemPath(id)
        propertiesChanged(path, Interface.item, changed: [("Locked", .bool(locked))], to: clients)
        signal(SecretObject.collectionPath, Interface.collection, "ItemChanged", to: clients) { $0.objectPath(path) }
    }

    func propertiesChanged(_ path: String, _ interface: String, changed: [(String, Value)] = [], invalidated: [String] = [],
                           to clients: [String]? = nil) {
        signal(path, Interface.properties, "PropertiesChanged", to: clients) { w in
            w.string(interface)
            w.properties(changed)
            w.open(UInt8(ascii: "a"), "s")
            for name in invalidated { w.string(name) }
            w.close()
        }
    }
}
