import Glibc
import Testing
import KeyholdCore
import KeyholdClient
@testable import KeyholdProtocol
import KeyholdTestSupport

/// Everything a peer can send is decoded here; these tests feed it valid and hostile bytes.
@Suite struct ProtocolTests {
    func bytes(_ s: SecureBytes) -> [UInt8] { s.withUnsafeBytes { Array($0) } }

    func roundTrip(_ m: ClientMessage) throws -> ClientMessage {
        try ClientMessage.decode(SecureBytes(copying: bytes(m.encode())))
    }

    @Test func requestRoundTrip() throws {
        var r = Request(.put, item: ItemReference(service: "github.com", account: "alice"))
        r.secret = SecureBytes(copying: [0, 1, 2, 255])
        r.appPassword = SecureBytes(copying: Array("pw".utf8))
        r.label = "Läbel"
        r.kind = .refreshToken
        r.policy = "biometry-current-set or device-passcode"
        r.allowedExecutables = ["/usr/bin/git", "/usr/bin/ssh"]
        r.reuseSeconds = 300
        r.update = true
        r.reason = "sync"
        r.allowInteraction = false
        r.since = -5
        guard case .request(let d) = try roundTrip(.request(r)) else { Issue.record("not a request"); return }
        #expect(d.operation == .put)
        #expect(d.item == r.item)
        expectSecret(d.secret.map(bytes), equals: [0, 1, 2, 255])
        expectSecret(d.appPassword.map(bytes), equals: Array("pw".utf8))
        #expect(d.label == "Läbel" && d.kind == .refreshToken && d.policy == r.policy)
        #expect(d.allowedExecutables == r.allowedExecutables && d.reuseSeconds == 300 && d.update)
        #expect(d.reason == "sync" && !d.allowInteraction && d.since == -5 && d.until == nil)
    }

    @Test func brokerMessagesRoundTrip() throws {
        var resp = Response(.lockedOut, detail: "wait")
        resp.secondsLeft = 60
        resp.fingers = ["right-index-finger", "left-thumb"]
        resp.secret = SecureBytes(copying: [9, 9])
        guard case .response(let r) = try BrokerMessage.decode(BrokerMessage.response(resp).encode()) else { Issue.record("no"); return }
        #expect(r.outcome == .lockedOut && r.detail == "wait" && r.secondsLeft == 60 && r.fingers == resp.fingers)
        expectSecret(r.secret.map(bytes), equals: [9, 9])

        let item = ItemInfo(id: "00", service: "s", account: "a", label: "", kind: .password, policy: "none",
                            allowedExecutables: ["/bin/x"], reuseSeconds: 5, createdAt: 1, updatedAt: 2)
        guard case .items(let items) = try BrokerMessage.decode(BrokerMessage.items([item, item]).encode()) else { Issue.record("no"); return }
        #expect(items == [item, item])

        guard case .prompt(let p) = try BrokerMessage.decode(BrokerMessage.prompt(Prompt(style: .echoOn, purpose: .appPassword, text: "Pw: ")).encode())
        else { Issue.record("no"); return }
        #expect(p.style == .echoOn && p.purpose == .appPassword && p.text == "Pw: ")
    }

    /// The announce carries what the broker verified and what the caller said as separate
    /// fields; a notice with caller fields but no executable is refused.
    @Test func announceNoticeRoundTripAndStrictness() throws {
        let a = Announcement(executable: "/usr/bin/git", pid: 4242, service: "s\r\u{1b}[2K", account: "a", reason: "why")
        guard case .notice(let n) = try BrokerMessage.decode(BrokerMessage.notice(Notice(announcing: a)).encode()) else { Issue.record("no"); return }
        #expect(n.announcement == a && n.style == .info && n.text.hasPrefix("keyhold: /usr/bin/git (pid 4242) asks for"))
        guard case .notice(let plain) = try BrokerMessage.decode(BrokerMessage.notice(Notice(style: .error, text: "x")).encode()) else { Issue.record("no"); return }
        #expect(plain.announcement == nil && plain.text == "x")
        // A summary of the longest fields still fits its text field.
        let long = String(repeating: "é", count: Limits.maxTextBytes / 2)
        let big = Notice(announcing: Announcement(executable: "/x", pid: 1, service: long, account: long, reason: long))
        #expect(big.text.utf8.count <= Limits.maxTextBytes)
        guard case .notice(let decoded) = try BrokerMessage.decode(BrokerMessage.notice(big).encode()) else { Issue.record("no"); return }
        #expect(decoded.announcement?.reason == long)
        let base: [Field] = [.number(1, 0), .text(2, "t")]
        for fields in [base + [.number(4, 1), .text(5, "s"), .text(6, "a")],                  // no executable
                       base + [.text(3, "/x"), .text(5, "s"), .text(6, "a")],                 // no pid
                       base + [.text(3, "/x"), .number(4, 1), .text(6, "a")],                 // no service
                       base + [.text(3, "/x"), .number(4, UInt64(UInt32.max) + 1), .text(5, "s"), .text(6, "a")],
                       base + [.text(7, "reason only")]] {
            #expect(throws: FrameError.self) { _ = try BrokerMessage.decode(PayloadEncoder.encode(type: 11, fields: fields)) }
        }
    }

    @Test func batchesFitInFrames() {
        let big = String(repeating: "x", count: Limits.maxTextBytes)
        let item = ItemInfo(id: "0", service: big, account: big, label: big, kind: .generic, policy: "none",
                            allowedExecutables: Array(repeating: big, count: Limits.maxAllowedExecutables), reuseSeconds: 0, createdAt: 0, updatedAt: 0)
        let batches = BrokerMessage.itemBatches(Array(repeating: item, count: 10))
        #expect(batches.count > 1)
        var total = 0
        for b in batches {
            #expect(b.encode().count <= Frame.maxPayloadBytes)
            if case .items(let i) = b { total += i.count }
        }
        #expect(total == 10)
        var decoded: [ItemInfo] = []
        for b in batches { if case .items(let i) = try? BrokerMessage.decode(b.encode()) { decoded += i } }
        #expect(decoded == Array(repeating: item, count: 10))
    }

    /// Hostile payloads: each must throw a FrameError, never crash, never decode to a request.
    @Test func hostilePayloadsAreRejected() throws {
        let valid = bytes(ClientMessage.request(Request(.get, item: ItemReference(service: "s", account: "a"))).encode())
        var cases: [[UInt8]] = [
            [], [1], [2, 1], [1, 99],                                   // empty, short, wrong version, unknown type
            [1, 1, 1, 0, 0],                                            // field header cut short
            [1, 1, 1, 0xff, 0xff, 0xff, 0xff, 1],                       // length beyond frame
            [1, 1, 200, 0, 0, 0, 0],                                    // unknown tag
            [1, 1, 1, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 99],             // unknown operation
            [1, 1, 1, 0, 0, 0, 3, 0, 0, 2],                             // number of 3 bytes
            [1, 1, 1, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 2],             // get without an item
            valid + [2, 0, 0, 0, 1, 0x41],                              // repeated service
            [1, 1, 1, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 2, 2, 0, 0, 0, 2, 0xc3, 0x28, 3, 0, 0, 0, 1, 0x61], // invalid UTF-8
            [1, 1, 1, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 2, 2, 0, 0, 0, 1, 0, 3, 0, 0, 0, 1, 0x61],           // NUL in text
            [1, 1, 1, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 3, 0, 0, 0, 1, 0x61],              // empty service
            [1, 1, 1, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 1, 2, 0, 0, 0, 1, 0x73, 3, 0, 0, 0, 1, 0x61],        // put without secret
            [1, 1, 1, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 2, 2, 0, 0, 0, 1, 0x73, 3, 0, 0, 0, 1, 0x61, 13, 0, 0, 0, 1, 2], // bad flag
            [1, 1, 1, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 2, 2, 0, 0, 0, 1, 0x73],                              // service w/o account
            [1, 2],                                                     // answer without value
            [1, 12, 1, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0],             // a broker message sent by a client
        ]
        // A text field over the limit, and a reuse window over 300 s.
        cases.append([1, 1, 1, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 2, 4, 0, 0, 0x10, 0x01] + Array(repeating: 0x61, count: 4097))
        cases.append([1, 1, 1, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 4, 8, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 1, 45])
        for c in cases {
            #expect(throws: FrameError.self, "payload \(c.prefix(24)) must be rejected") { _ = try ClientMessage.decode(SecureBytes(copying: c)) }
        }
    }

    /// The tag sets every received field is checked against: each of the 256 tags is in a set
    /// exactly when it was put there, across the mask's four words.
    @Test func tagSetsHoldExactlyTheirTags() {
        let chosen: [UInt8] = [0, 1, 62, 63, 64, 65, 127, 128, 191, 192, 254, 255]
        let set = TagSet(chosen)
        for tag in 0...255 { #expect(set.contains(UInt8(tag)) == chosen.contains(UInt8(tag)), "tag \(tag)") }
        var grown: TagSet = []
        for tag in chosen { grown.insert(tag) }
        #expect(grown == set)
        #expect(!([] as TagSet).contains(0) && !([] as TagSet).contains(255))
    }

    /// Random mutations of valid payloads never crash the decoder (bounded: 20,000 cases).
    @Test func mutatedPayloadsNeverCrash() {
        var r = Request(.put, item: ItemReference(service: "svc", account: "acct"))
        r.secret = SecureBytes(copying: Array("top".utf8))
        r.allowedExecutables = ["/bin/a"]
        let seeds = [bytes(ClientMessage.request(r).encode()), bytes(ClientMessage.answer(SecureBytes(copying: [1])).encode())]
        var rng = SystemRandomNumberGenerator()
        var decoded = 0
        for i in 0..<20_000 {
            var b = seeds[i % seeds.count]
            for _ in 0..<Int.random(in: 1...4, using: &rng) {
                switch Int.random(in: 0..<3, using: &rng) {
                case 0 where !b.isEmpty: b[Int.random(in: 0..<b.count, using: &rng)] = UInt8.random(in: 0...255, using: &rng)
                case 1 where !b.isEmpty: b.removeLast(Int.random(in: 0...min(b.count, 8), using: &rng))
                default: b.append(UInt8.random(in: 0...255, using: &rng))
                }
            }
            if (try? ClientMessage.decode(SecureBytes(copying: b))) != nil { decoded += 1 }
            _ = try? BrokerMessage.decode(SecureBytes(copying: b))
        }
        #expect(decoded < 20_000)
    }

    @Test func framesOverASocketPair() throws {
        var fds: [Int32] = [0, 0]
        #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &fds) == 0)
        defer { close(fds[0]); close(fds[1]) }
        try Frame.write(ClientMessage.cancel.encode(), to: fds[0])
        let got = try #require(try Frame.read(from: fds[1]))
        guard case .cancel = try ClientMessage.decode(got) else { Issue.record("not cancel"); return }

        // An oversized length header is refused before anything is allocated for it.
        let header: [UInt8] = [0x7f, 0xff, 0xff, 0xff]
        _ = header.withUnsafeBytes { write(fds[0], $0.baseAddress, 4) }
        #expect(throws: FrameError.oversized(0x7fff_ffff)) { _ = try Frame.read(from: fds[1]) }

        // A truncated frame: the header promises 10 bytes, 3 arrive, then the peer closes.
        let partial: [UInt8] = [0, 0, 0, 10, 1, 1, 1]
        _ = partial.withUnsafeBytes { write(fds[0], $0.baseAddress, $0.count) }
        shutdown(fds[0], Int32(SHUT_WR))
        #expect(throws: FrameError.truncated) { _ = try Frame.read(from: fds[1]) }
    }

    // MARK: audit export

    func mac(_ b: UInt8) -> [UInt8] { [UInt8](repeating: b, count: 32) }

    func exportRow(seq: Int64 = 1, row: [UInt8] = [1, 2, 3]) -> AuditEntryInfo {
        AuditEntryInfo(seq: seq, readable: AuditReadableFields(
                           time: 1_700_000_000_000_000, callerUID: 1000, callerPID: 42, executable: "/usr/bin/x", operation: "get",
                           itemID: String(repeating: "ab", count: 16), service: "s", account: "a", decision: "granted",
                           method: "password", reason: nil, outcome: "ok"),
                       mac: String(repeating: "0a", count: 32), previousMAC: String(repeating: "0b", count: 32), row: row)
    }

    @Test func exportMessagesRoundTrip() throws {
        let header = AuditExportHeader(startSeq: 6, startMAC: mac(1), throughSeq: 9, throughMAC: mac(2), tag: mac(3))
        var r = Request(.auditVerifyExport)
        r.exportHeader = header
        guard case .request(let d) = try roundTrip(.request(r)) else { Issue.record("not a request"); return }
        #expect(d.operation == .auditVerifyExport && d.exportHeader == header)

        var q = Request(.audit)
        q.until = 99
        q.withRows = true
        guard case .request(let dq) = try roundTrip(.request(q)) else { Issue.record("not a request"); return }
        #expect(dq.withRows && dq.until == 99 && dq.exportHeader == nil)

        let rows = [exportRow(seq: 1), exportRow(seq: 2, row: [])]
        guard case .auditRows(let got) = try roundTrip(.auditRows(rows)) else { Issue.record("not rows"); return }
        #expect(got == rows && got[0].exportRow?.mac == mac(0x0a) && got[0].exportRow?.previousMAC == mac(0x0b))
        guard case .auditRowsEnd = try roundTrip(.auditRowsEnd) else { Issue.record("not the end marker"); return }

        guard case .auditExportHeader(let h) = try BrokerMessage.decode(BrokerMessage.auditExportHeader(header).encode()) else {
            Issue.record("not a header"); return
        }
        #expect(h == header)
        guard case .auditEntries(let e) = try BrokerMessage.decode(BrokerMessage.auditEntries(rows).encode()) else {
            Issue.record("not entries"); return
        }
        #expect(e == rows)
    }

    @Test func exportBatchesFitInFrames() throws {
        let big = String(repeating: "x", count: Limits.maxTextBytes)
        var row = exportRow(row: [UInt8](repeating: 7, count: AuditExportRow.maxRowBytes))
        row.readable.executable = big; row.readable.service = big; row.readable.account = big; row.readable.reason = big
        let rows = Array(repeating: row, count: 20)
        let toBroker = ClientMessage.auditRowBatches(rows)
        let toClient = BrokerMessage.auditBatches(rows)
        #expect(toBroker.count > 1 && toClient.count > 1)
        var total = 0
        for b in toBroker {
            let payload = b.encode()
            #expect(payload.count <= Frame.maxPayloadBytes)
            if case .auditRows(let r) = try ClientMessage.decode(payload) { total += r.count }
        }
        #expect(total == 20)
        for b in toClient { #expect(b.encode().count <= Frame.maxPayloadBytes) }
    }

    /// Hostile export requests and row batches: each must throw a FrameError.
    @Test func hostileExportPayloadsAreRejected() throws {
        func request(_ fields: [Field]) -> [UInt8] { bytes(PayloadEncoder.encode(type: 1, fields: fields)) }
        func rows(_ entries: [[Field]]) -> [UInt8] {
            bytes(PayloadEncoder.encode(type: 4, fields: entries.map { Field(1, .nested($0)) }))
        }
        let op = Field.number(1, UInt64(Operation.auditVerifyExport.rawValue))
        let header: [Field] = [.number(19, 0), Field(20, .bytes(mac(1))), .number(21, 3), Field(22, .bytes(mac(2))), Field(23, .bytes(mac(3)))]
        #expect(throws: Never.self) { _ = try ClientMessage.decode(SecureBytes(copying: request([op] + header))) }
        var cases: [[UInt8]] = [
            request([op]),                                                       // no header
            request([op] + header.dropLast()),                                   // header without its tag
            request([op] + header.dropFirst()),                                  // header without its start
            request([op] + [.number(19, 0), Field(20, .bytes(Array(mac(1).dropLast()))), .number(21, 3),
                            Field(22, .bytes(mac(2))), Field(23, .bytes(mac(3)))]),   // a 31-byte MAC
            request([op] + [.number(19, 0), Field(20, .bytes(mac(1) + [0])), .number(21, 3),
                            Field(22, .bytes(mac(2))), Field(23, .bytes(mac(3)))]),   // a 33-byte MAC
            request([op] + [.number(19, 5), Field(20, .bytes(mac(1))), .number(21, 3),
                            Field(22, .bytes(mac(2))), Field(23, .bytes(mac(3)))]),   // ends before it starts
            request([op] + [.number(19, UInt64.max), Field(20, .bytes(mac(1))), .number(21, UInt64.max),
                            Field(22, .bytes(mac(2))), Field(23, .bytes(mac(3)))]),   // negative seqs
            request([.number(1, UInt64(Operation.auditVerify.rawValue))] + header),   // header on another operation
            request([.number(1, UInt64(Operation.list.rawValue)), .flag(18)]),        // rows outside an audit query
            request([.number(1, UInt64(Operation.audit.rawValue)), .flag(18), .flag(16)]),   // an export that follows
            request([.number(1, UInt64(Operation.audit.rawValue)), .flag(18), .text(2, "s"), .text(3, "a")]),  // of one item
            request([op] + header + [Field(23, .bytes(mac(4)))]),                     // repeated tag
            [1, 4],                                                              // an empty row batch
            [1, 5, 1, 0, 0, 0, 0],                                               // an end marker with a field
        ]
        let complete = BrokerMessage.fields(of: exportRow())
        func without(_ tag: UInt8) -> [Field] { complete.filter { $0.tag != tag } }
        func replacing(_ tag: UInt8, _ f: Field) -> [Field] { without(tag) + [f] }
        cases.append(rows([without(16)]))                                        // no row bytes
        cases.append(rows([without(14)]))                                        // no MAC
        cases.append(rows([replacing(14, .text(14, String(repeating: "0A", count: 32)))]))   // uppercase hex
        cases.append(rows([replacing(14, .text(14, String(repeating: "0a", count: 31)))]))   // 31-byte MAC
        cases.append(rows([replacing(15, .text(15, String(repeating: "zz", count: 32)))]))   // not hex
        cases.append(rows([replacing(1, .number(1, 0))]))                        // seq 0
        cases.append(rows([replacing(16, Field(16, .bytes([UInt8](repeating: 0, count: AuditExportRow.maxRowBytes + 1))))]))
        cases.append(rows([complete, without(16)]))                              // one good row, one incomplete
        cases.append(rows([complete + [Field(99, .bytes([]))]]))                 // unknown tag in a row
        for c in cases {
            #expect(throws: FrameError.self, "payload \(c.prefix(24)) must be rejected") { _ = try ClientMessage.decode(SecureBytes(copying: c)) }
        }
        // The broker's header message, just as strictly.
        for fields in [[Field]](arrayLiteral: [.number(1, 0)], [.number(1, 0), Field(2, .bytes([1])), .number(3, 0),
                                                               Field(4, .bytes(mac(2))), Field(5, .bytes(mac(3)))]) {
            #expect(throws: FrameError.self) { _ = try BrokerMessage.decode(PayloadEncoder.encode(type: 15, fields: fields)) }
        }
    }

}
