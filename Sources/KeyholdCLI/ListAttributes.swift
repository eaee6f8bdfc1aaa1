import KeyholdClient

/// The attribute map `keyhold ls` shows for an item, decoded from its (service, account) name
/// (the Secret Service's `ss:` account form, or plain {service, account}). Shown through
/// `Output.table`, which escapes every cell with `Printable`; JSON escapes on its own.
enum ListAttributes {
    static func map(_ i: ItemInfo) -> [(String, String)] {
        AttributeMapping.attributes(service: i.service, account: i.account)
            .sorted { Array($0.key.utf8).lexicographicallyPrecedes(Array($1.key.utf8)) }
            .map { ($0.key, $0.value) }
    }

    /// Whether the item was named through the Secret Service with a map beyond {service, account}.
    static func isEncoded(_ i: ItemInfo) -> Bool {
        let m = AttributeMapping.attributes(service: i.service, account: i.account)
        return !(m.count == 2 && m["service"] == i.service && m["account"] == i.account)
    }

    /// `key=value` pairs, space-separated (the cell is escaped by the table).
    static func text(_ i: ItemInfo) -> String {
        map(i).map { "\($0.0)=\($0.1)" }.joined(separator: " ")
    }

    static func json(_ i: ItemInfo) -> JSON {
        .objectValue(map(i).map { ($0.0, JSON.string($0.1)) })
    }
}
