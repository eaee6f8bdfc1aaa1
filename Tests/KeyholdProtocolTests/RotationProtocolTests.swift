import Testing
import KeyholdCore
import KeyholdClient
@testable import KeyholdProtocol
import KeyholdTestSupport

/// The rotation messages (issue 10): round trips, and every field refused where it does not belong.
@Suite struct RotationProtocolTests {
    func bytes(_ s: SecureBytes) -> [UInt8] { s.withUnsafeBytes { Array($0) } }
    func client(_ b: [UInt8]) throws -> ClientMessage { try ClientMessage.decode(SecureBytes(copying: b)) }
    let item = ItemReference(service: "idp", account: "me")

    @Test func rotationMessagesRoundTrip() throws {
        var r = Request(.rotate, item: item)
        r.timeoutSeconds = 90
        r.reason = "refresh"
        guard case .request(let d) = try client(bytes(ClientMessage.request(r).encode())) else { Issue.record("no"); return }
        #expect(d.operation == .rotate && d.item == item && d.timeoutSeconds == 90 && d.reason == "refresh")

        var put = Request(.put, item: item)
        put.secret = SecureBytes(copying: [1])
        put.update = true
        put.ifGeneration = 7
        put.expires = 1_800_000_000_000_000
        guard case .request(let p) = try client(bytes(ClientMessage.request(put).encode())) else { Issue.record("no"); return }
        #expect(p.ifGeneration == 7 && p.expires == 1_800_000_000_000_000)

        guard case .rotated(let s, let e) = try client(bytes(ClientMessage.rotated(SecureBytes(copying: [4, 2]), expires: -1).encode()))
        else { Issue.record("no"); return }
        expectSecret(bytes(s), equals: [4, 2])
        #expect(e == -1)

        guard case .rotationCurrent(let c, let g) = try BrokerMessage.decode(BrokerMessage.rotationCurrent(SecureBytes(copying: [9]), generation: 3).encode())
        else { Issue.record("no"); return }
        expectSecret(bytes(c), equals: [9])
        #expect(g == 3)

        var resp = Response(.ok)
        resp.generation = 12
        resp.expires = 5
        guard case .response(let back) = try BrokerMessage.decode(BrokerMessage.response(resp).encode()) else { Issue.record("no"); return }
        #expect(back.generation == 12 && back.expires == 5)

        let info = ItemInfo(id: "00", service: "s", account: "a", label: "", kind: .refreshToken, policy: "none",
                            allowedExecutables: [], reuseSeconds: 0, createdAt: 1, updatedAt: 2, generation: 4, expires: 99)
        guard case .items(let items) = try BrokerMessage.decode(BrokerMessage.items([info]).encode()) else { Issue.record("no"); return }
        #expect(items == [info])
    }

    @Test func hostileRotationFramesAreRejected() throws {
        func request(_ edit: (inout Request) -> Void, _ op: Operation = .rotate) -> [UInt8] {
            var r = Request(op, item: item)
            edit(&r)
            return bytes(ClientMessage.request(r).encode())
        }
        let n: (UInt8, UInt64) -> [UInt8] = { tag, v in [tag, 0, 0, 0, 8] + (0..<8).map { UInt8(truncatingIfNeeded: v >> (56 - 8 * UInt64($0))) } }
        let rotate = request { _ in }
        let cases: [(String, [UInt8])] = [
            ("rotate without an item", bytes(ClientMessage.request(Request(.rotate)).encode())),
            ("timeout 0", rotate + n(26, 0)),
            ("timeout over the limit", rotate + n(26, UInt64(Limits.maxRotationSeconds) + 1)),
            ("timeout on a get", request({ _ in }, .get) + n(26, 5)),
            ("if-generation on a rotate", rotate + n(25, 1)),
            ("if-generation on a put without --update", request({ $0.secret = SecureBytes(copying: [1]) }, .put) + n(25, 1)),
            ("expiry on a rotate request", rotate + n(27, 1)),
            ("rotate with a secret", request { $0.secret = SecureBytes(copying: [1]) }),
            ("rotate with an app password", request { $0.appPassword = SecureBytes(copying: [1]) }),
            ("rotate with a policy", request { $0.policy = "none" }),
            ("rotate with --update", request { $0.update = true }),
            ("rotated without a secret", [1, 6] + n(2, 1)),
            ("rotated with an unknown tag", [1, 6, 1, 0, 0, 0, 1, 0x41, 9, 0, 0, 0, 0]),
            ("rotated with a secret over 64 KiB", [1, 6, 1, 0, 1, 0, 1] + [UInt8](repeating: 0x41, count: Limits.maxSecretBytes + 1)),
            ("rotated with an expiry of 3 bytes", [1, 6, 1, 0, 0, 0, 1, 0x41, 2, 0, 0, 0, 3, 1, 2, 3]),
            ("rotated twice the secret", [1, 6, 1, 0, 0, 0, 1, 0x41, 1, 0, 0, 0, 1, 0x42]),
            ("a broker's rotation offer sent by a client", bytes(BrokerMessage.rotationCurrent(SecureBytes(copying: [1]), generation: 1).encode())),
        ]
        for (what, payload) in cases {
            #expect(throws: FrameError.self, "\(what) must be rejected") { _ = try client(payload) }
        }
        // The client is as strict with the broker's offer.
        for payload: [UInt8] in [[1, 16] + n(2, 1), [1, 16, 1, 0, 0, 0, 1, 0x41], [1, 16, 1, 0, 0, 0, 1, 0x41] + n(2, 1) + n(3, 1)] {
            #expect(throws: FrameError.self) { _ = try BrokerMessage.decode(SecureBytes(copying: payload)) }
        }
    }
}
