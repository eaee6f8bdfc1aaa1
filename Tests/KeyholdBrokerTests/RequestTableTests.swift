import Foundation
import Glibc
import Testing
import KeyholdCore
import KeyholdVault
import KeyholdProtocol
import KeyholdTestSupport
@testable import KeyholdBroker

/// The request table (RequestTable.swift) against a real vault inside a real `Broker`: its
/// columns are enforced by the dispatcher, and a secret leaves only through the rows that may
/// release, each release committed with its audit entry under the writer first.
@Suite(.serialized, .timeLimit(.minutes(3))) struct RequestTableTests {
    typealias Harness = ReaderLookupTests.Harness
    static let marker = "S3CRET-MARKER-7f3a"

    /// Serves `request` as `caller` over a socket pair whose client end has sent all it will
    /// (a prompt or a rotation's reply reads the end: canceled), then returns every byte the
    /// session wrote and the response it sent.
    static func serve(_ request: Request, as caller: Caller, _ h: Harness) -> (bytes: [UInt8], response: Response) {
        var sv: [Int32] = [-1, -1]
        #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &sv) == 0)
        shutdown(sv[1], Int32(SHUT_WR))
        let session = Session(fd: sv[0], caller: caller, broker: h.broker)
        let response = session.dispatch(request)
        session.send(.response(response))
        close(sv[0])
        var bytes: [UInt8] = [], chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = read(sv[1], &chunk, chunk.count)
            if n <= 0 { break }
            bytes += chunk[0..<n]
        }
        close(sv[1])
        return (bytes, response)
    }

    static func entries(_ h: Harness) -> [AuditEntryView] {
        h.broker.withStore { store in (try? store.auditEntries(visibleTo: nil)) ?? [] }
    }

    static func request(for kind: RequestKind) -> Request {
        var r = Request(kind.operation, item: Harness.ref)
        r.withRows = kind.exportsRows
        r.allowInteraction = false
        r.until = currentMicroseconds()
        if kind.operation == .put {
            r.update = true
            r.secret = SecureBytes(copying: Array("the put's own".utf8))
        }
        return r
    }

    /// Every row of the table driven once with a request naming an item whose secret is a
    /// marker (as root for the root-only rows, else as the item's owner): the marker appears in
    /// what a session wrote only for rows that may release (`get` must show it), and each time
    /// together with one more `get` entry granted for that item, committed by the group commit
    /// before the answer. Then `Session.release`, the one place a secret is opened for a
    /// caller, called from every row: it opens nothing for a row that may not release.
    @Test func onlyTheReleasingRowsHandOutASecretAndOnlyAfterTheirEntryIsCommitted() throws {
        let h = try Harness()
        _ = try #require(h.add(Self.marker))
        let owner = ReleaseGateTests.caller()
        let marker = Array(Self.marker.utf8)
        var released: [KeyholdProtocol.Operation] = []
        for kind in RequestKind.table {
            let grantedBefore = Self.entries(h).filter { $0.readable.operation == "get" && $0.readable.decision == "granted" }.count
            let commitsBefore = h.broker.group.membersCommitted
            let (bytes, _) = Self.serve(Self.request(for: kind), as: kind.rootOnly == nil ? owner : owner.sentBy(uid: 0), h)
            let leaked = bytes.count >= marker.count && (0...(bytes.count - marker.count)).contains { Array(bytes[$0..<$0 + marker.count]) == marker }
            guard leaked else { continue }
            released.append(kind.operation)
            #expect(kind.releases, "\(kind.operation) handed out a secret")
            let granted = Self.entries(h).filter { $0.readable.operation == "get" && $0.readable.decision == "granted" }
            #expect(granted.count == grantedBefore + 1, "\(kind.operation): no release entry")
            #expect(h.broker.group.membersCommitted > commitsBefore, "\(kind.operation): released outside the group commit")
        }
        #expect(released.contains(.get))

        // The `delete` row removed the item: a new one for the direct calls.
        let item = try #require(h.add(Self.marker))

        for kind in RequestKind.table {
            var session = h.session()
            session.kind = kind
            let opened = session.release(item, Request(.get, item: Harness.ref), method: .none, appPassword: nil)
            switch opened {
            case .success(let o):
                #expect(kind.releases, "\(kind.operation) opened a secret")
                o.secret.wipe()
            case .failure(let d):
                #expect(!kind.releases, "\(kind.operation): \(d.outcome)")
            }
        }
    }

    /// A root-only row asked by a user is refused before its handler runs: the prune, which
    /// would remove every entry if its handler ran (it has no root check of its own), removes
    /// nothing, and the refusal is audited under the user.
    @Test func aRootOnlyRequestFromAUserIsRefusedBeforeItsHandlerRuns() throws {
        let h = try Harness()
        _ = try #require(h.add("v"))
        let before = Self.entries(h).count
        let prune = try #require(RequestKind.table.first { $0.operation == .auditPrune })
        #expect(prune.rootOnly != nil)
        let (_, response) = Self.serve(Self.request(for: prune), as: ReleaseGateTests.caller(), h)
        #expect(response.outcome == .notAuthorized && response.detail == prune.rootOnly)
        let after = Self.entries(h)
        #expect(after.count == before + 1, "entries were pruned")
        #expect(after.last?.readable.operation == "audit-prune" && after.last?.readable.decision == "denied")
        #expect(after.last?.readable.callerUID == ReleaseGateTests.uid)
        // Root's prune runs its handler.
        let (_, rootResponse) = Self.serve(Self.request(for: prune), as: ReleaseGateTests.caller().sentBy(uid: 0), h)
        #expect(rootResponse.outcome == .ok)
    }

    /// Every operation a client can send has exactly one row (two for `audit`: a query and an export).
    @Test func everyOperationHasItsRow() {
        for op in KeyholdProtocol.Operation.allCases {
            #expect(RequestKind.table.filter { $0.operation == op }.count == (op == .audit ? 2 : 1), "\(op)")
        }
    }
}
