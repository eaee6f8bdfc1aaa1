import KeyholdCore

/// Wire fields of `search`: each query pair is one nested field (key, value), repeated.
/// Checked as strictly as every other message: at most `Limits.maxAttributePairs` pairs, each
/// text within `Limits.maxTextBytes`, no key twice, and pairs only on a `search` request.
package enum SearchWire {
    static let keyTag: UInt8 = 1, valueTag: UInt8 = 2

    package static func fields(_ query: [String: String], tag: UInt8) -> [Field] {
        // Sorted: the same query always encodes to the same bytes.
        query.sorted { Array($0.key.utf8).lexicographicallyPrecedes(Array($1.key.utf8)) }.map { pair in
            Field(tag, .nested([.text(keyTag, pair.key), .text(valueTag, pair.value)]))
        }
    }

    static func decodeRequestFields(_ fs: FieldSet, into r: inout Request, tag: UInt8) throws(FrameError) {
        let pairs = try fs.nested(tag, allowed: [keyTag, valueTag])
        guard pairs.isEmpty || r.operation == .search else { throw .malformed("search pairs are for search only") }
        guard pairs.count <= Limits.maxAttributePairs else { throw .malformed("more than \(Limits.maxAttributePairs) search pairs") }
        if r.operation == .search && r.item != nil { throw .malformed("search names no item") }
        var query: [String: String] = [:]
        for p in pairs {
            let key = try p.requiredText(keyTag), value = try p.requiredText(valueTag)
            guard query.updateValue(value, forKey: key) == nil else { throw .malformed("search pair repeated") }
        }
        r.searchAttributes = query
    }
}
