import Testing
import KeyholdClient
import KeyholdSecretService
import KeyholdProtocol

/// The parsing of D-Bus input that is pure: attribute maps, labels, object paths, peer keys.
@Suite struct AttributeMappingTests {
    @Test func serviceAndAccountAreExactlyTheCLINames() throws {
        let ref = try AttributeMapping.reference(for: ["service": "github.com", "account": "ann"])
        #expect(ref == ItemReference(service: "github.com", account: "ann"))
        #expect(AttributeMapping.attributes(service: "github.com", account: "ann") == ["service": "github.com", "account": "ann"])
    }

    @Test func anyMapRoundTripsAndNamesOneItem() throws {
        let alphabet = Array("ab=&%:x 3é\u{1F}")
        for n in 0..<500 {
            var map: [String: String] = [:]
            for _ in 0..<(n % 6) {
                let k = String((0..<Int.random(in: 1...6)).map { _ in alphabet.randomElement()! })
                map[k] = String((0..<Int.random(in: 0...8)).map { _ in alphabet.randomElement()! })
            }
            let ref = try AttributeMapping.reference(for: map)
            #expect(!ref.service.isEmpty && !ref.account.isEmpty)
            let back = AttributeMapping.attributes(service: ref.service, account: ref.account)
            // Every pair comes back; at most a `service` the client did not set is added.
            #expect(AttributeMapping.matches(back, map), "\(map) -> \(ref) -> \(back)")
            #expect(try AttributeMapping.reference(for: back) == ref, "the same map names the same item")
        }
    }

    @Test func searchIsBySubset() {
        let attrs = ["service": "s", "username": "bob", "application": "Python keyring library"]
        #expect(AttributeMapping.matches(attrs, [:]))
        #expect(AttributeMapping.matches(attrs, ["username": "bob"]))
        #expect(!AttributeMapping.matches(attrs, ["username": "bob", "service": "t"]))
    }

    @Test func capsAndCLIAccountsThatLookEncoded() throws {
        var many: [String: String] = [:]
        for i in 0..<65 { many["k\(i)"] = "v" }
        #expect(throws: AttributeMapping.MappingError.tooManyAttributes) { try AttributeMapping.reference(for: many) }
        #expect(throws: AttributeMapping.MappingError.tooLarge) { try AttributeMapping.reference(for: ["a": String(repeating: "x", count: 5000)]) }
        // A CLI account that starts with "ss:" but is not an encoding stays a plain name.
        #expect(AttributeMapping.attributes(service: "s", account: "ss:%zz") == ["service": "s", "account": "ss:%zz"])
    }

    @Test func labelsCarryTheContentType() {
        #expect(LabelEncoding.encode(label: "x", contentType: "text/plain") == "x")
        let stored = LabelEncoding.encode(label: "a\u{1F}b", contentType: "application/octet-stream")
        #expect(LabelEncoding.decode(stored) == ("ab", "application/octet-stream"))
        #expect(LabelEncoding.decode("plain") == ("plain", "text/plain"))
    }

    @Test func objectPathsResolveStrictly() {
        let id = String(repeating: "ab", count: 16)
        #expect(SecretObject.resolve("/org/freedesktop/secrets") == .service)
        #expect(SecretObject.resolve("/org/freedesktop/secrets/aliases/default") == .collection)
        #expect(SecretObject.resolve("/org/freedesktop/secrets/collection/login/" + id) == .item(id))
        #expect(SecretObject.resolve("/org/freedesktop/secrets/aliases/default/" + id) == .item(id))
        for bad in ["/org/freedesktop/secrets/collection/login/" + id.uppercased(), "/org/freedesktop/secrets/collection/login/ab",
                    "/org/freedesktop/secrets/collection/other", "/org/freedesktop/secrets/session/", "/org/freedesktop/secrets/session/1x",
                    "/org/freedesktop/secrets/prompt/99999999999", "/", "/org/freedesktop/secretsX"] {
            #expect(SecretObject.resolve(bad) == nil, "\(bad)")
        }
    }

    @Test func peerKeysOutsideTheGroupAreRefused() {
        let p1024: [UInt8] = [UInt8](repeating: 0xFF, count: 128)  // above p
        for bad in [[UInt8](), [1], [0], p1024, [UInt8](repeating: 7, count: 129)] {
            #expect(throws: BusError.self) { _ = try SecretSession.negotiate(peerPublicKey: bad) }
        }
        #expect(throws: Never.self) { _ = try SecretSession.negotiate(peerPublicKey: [2]) }
    }
}
