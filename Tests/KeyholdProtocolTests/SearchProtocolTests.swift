import Testing
import KeyholdCore
import KeyholdClient
@testable import KeyholdProtocol

/// The `search` request (issue 11): a round trip, and every malformed or oversized query refused.
@Suite struct SearchProtocolTests {
    func bytes(_ s: SecureBytes) -> [UInt8] { s.withUnsafeBytes { Array($0) } }
    func client(_ b: [UInt8]) throws -> ClientMessage { try ClientMessage.decode(SecureBytes(copying: b)) }
    /// A TLV field: tag, 4-byte length, value.
    func tlv(_ tag: UInt8, _ value: [UInt8]) -> [UInt8] {
        [tag] + (0..<4).map { UInt8(truncatingIfNeeded: value.count >> (24 - 8 * $0)) } + value
    }
    func pair(_ key: String, _ value: String) -> [UInt8] { tlv(28, tlv(1, Array(key.utf8)) + tlv(2, Array(value.utf8))) }
    var searchHeader: [UInt8] { [1, 1] + tlv(1, [0, 0, 0, 0, 0, 0, 0, Operation.search.rawValue]) }

    @Test func searchRoundTrips() throws {
        var r = Request(.search)
        r.searchAttributes = ["xdg:schema": "org.example.Password", "user": "ann", "empty": "", "ünï": "c=d&e%"]
        guard case .request(let d) = try client(bytes(ClientMessage.request(r).encode())) else { Issue.record("no request"); return }
        #expect(d.operation == .search && d.item == nil && d.searchAttributes == r.searchAttributes)
        guard case .request(let all) = try client(bytes(ClientMessage.request(Request(.search)).encode())) else { Issue.record("no"); return }
        #expect(all.searchAttributes.isEmpty)
        // The encoding is canonical: the same query, the same bytes.
        #expect(bytes(ClientMessage.request(r).encode()) == bytes(ClientMessage.request(r).encode()))
        // The most pairs, each of the longest text, still decode.
        let long = String(repeating: "v", count: Limits.maxTextBytes)
        let most = searchHeader + (0..<Limits.maxAttributePairs).flatMap { pair("k\($0)", long) }
        guard case .request(let m) = try client(most) else { Issue.record("no"); return }
        #expect(m.searchAttributes.count == Limits.maxAttributePairs)
    }

    @Test func malformedOrOversizedSearchFramesAreRejected() throws {
        let long = String(repeating: "v", count: Limits.maxTextBytes + 1)
        var get = Request(.get, item: ItemReference(service: "s", account: "a"))
        get.reason = "x"
        let cases: [(String, [UInt8])] = [
            ("one pair too many", searchHeader + (0...Limits.maxAttributePairs).flatMap { pair("k\($0)", "v") }),
            ("a value over the text limit", searchHeader + pair("k", long)),
            ("a key over the text limit", searchHeader + pair(long, "v")),
            ("a key twice", searchHeader + pair("k", "1") + pair("k", "2")),
            ("a pair without a value", searchHeader + tlv(28, tlv(1, Array("k".utf8)))),
            ("a pair without a key", searchHeader + tlv(28, tlv(2, Array("v".utf8)))),
            ("a pair with its key twice", searchHeader + tlv(28, tlv(1, [0x61]) + tlv(1, [0x62]) + tlv(2, [0x63]))),
            ("an unknown tag in a pair", searchHeader + tlv(28, tlv(1, [0x61]) + tlv(2, [0x62]) + tlv(3, [0x63]))),
            ("a pair cut short", searchHeader + [28, 0, 0, 0, 9] + tlv(1, [0x61])),
            ("a pair whose inner length runs past it", searchHeader + tlv(28, [1, 0, 0, 0, 200, 0x61])),
            ("invalid UTF-8 in a value", searchHeader + tlv(28, tlv(1, [0x61]) + tlv(2, [0xc3, 0x28]))),
            ("NUL in a key", searchHeader + tlv(28, tlv(1, [0x61, 0]) + tlv(2, [0x62]))),
            ("search pairs on a get", bytes(ClientMessage.request(get).encode()) + pair("k", "v")),
            ("search pairs on a list", [1, 1] + tlv(1, [0, 0, 0, 0, 0, 0, 0, Operation.list.rawValue]) + pair("k", "v")),
            ("a search that names an item", searchHeader + tlv(2, [0x73]) + tlv(3, [0x61])),
        ]
        for (what, payload) in cases {
            #expect(throws: FrameError.self, "\(what) must be rejected") { _ = try client(payload) }
        }
    }
}
