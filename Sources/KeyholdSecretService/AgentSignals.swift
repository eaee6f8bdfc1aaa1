import CSystemd

/// Change notifications: the collection's Item* signals, the service's CollectionChanged and
/// org.freedesktop.DBus.Properties.PropertiesChanged, so clients that cache (KDE, browsers,
/// seahorse) see changes made by other clients.
///
/// Changed properties are sent as *invalidated* (names without values) except where the value
/// is known without asking the broker: reading an item's new label or modification time would
/// cost a listing of the user's items per change. A client re-reads an invalidated property.
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
    /// changed (for `.changed`).
    func announce(_ event: ItemEvent, item id: String, changedProperties: [String] = []) {
        let path = SecretObject.itemPath(id)
        signal(SecretObject.collectionPath, Interface.collection, event.member) { $0.objectPath(path) }
        switch event {
        case .created, .deleted:
            propertiesChanged(SecretObject.collectionPath, Interface.collection, invalidated: ["Items", "Modified"])
        case .changed:
            propertiesChanged(path, Interface.item, invalidated: changedProperties)
            propertiesChanged(SecretObject.collectionPath, Interface.collection, invalidated: ["Modified"])
        }
        signal(SecretObject.servicePath, Interface.service, "CollectionChanged") { $0.objectPath(SecretObject.collectionPath) }
    }

    /// An item's lock state changed (unlocked by a prompt, or locked by Lock).
    func announceLocked(_ id: String, _ locked: Bool) {
        propertiesChanged(SecretObject.itemPath(id), Interface.item, changed: [("Locked", .bool(locked))])
    }

    func propertiesChanged(_ path: String, _ interface: String, changed: [(String, Value)] = [], invalidated: [String] = []) {
        signal(path, Interface.properties, "PropertiesChanged") { w in
            w.string(interface)
            w.open(UInt8(ascii: "a"), "{sv}")
            for (name, value) in changed {
                w.open(UInt8(ascii: "e"), "sv")
                w.string(name)
                value.write(w)
                w.close()
            }
            w.close()
            w.open(UInt8(ascii: "a"), "s")
            for name in invalidated { w.string(name) }
            w.close()
        }
    }
}
