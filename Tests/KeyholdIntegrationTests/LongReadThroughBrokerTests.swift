import Foundation
import Glibc
import Testing
import KeyholdClient
import KeyholdCore
import KeyholdTestSupport

/// The reads a caller can make long (`list`, `search`, `audit`, `audit verify`) run on the
/// broker's long-read connection, off the store lock, through a real broker over its socket:
/// `audit verify` reads one snapshot while other callers' gets append entries and a prune moves
/// the chain's start, and finds the chain intact every time.
@Suite(.serialized, .timeLimit(.minutes(5))) struct LongReadThroughBrokerTests {
    @Test func auditVerifyWhileEntriesAreAppendedAndPrunedIsIntactEveryTime() throws {
        let b = try BrokerFixture()
        let vault = Vault(socketPath: b.socketPath)
        for i in 0..<4 { try vault.add(ReaderThroughBrokerTests.bytes("l\(i)"), service: "load", account: "a\(i)") }
        for _ in 0..<500 { try vault.secret(service: "load", account: "a0").wipe() }
        let stop = Flag()
        let loaders = ReaderThroughBrokerTests.load(Vault(socketPath: b.socketPath), threads: 4, stop: stop)
        var reports: [AuditVerificationReport] = []
        for round in 0..<20 {
            if round == 10 { _ = try vault.pruneAudit(until: Int64(Date().timeIntervalSince1970 * 1_000_000) - 200_000) }
            reports.append(try vault.verifyAudit())
        }
        stop.set()
        for _ in 0..<4 { loaders.wait() }
        let failed = reports.filter { !$0.verified }
        #expect(failed.isEmpty, "\(failed)")
        #expect(reports.allSatisfy { $0.count > 0 })
        let after = try vault.verifyAudit()
        #expect(after.verified && after.count >= reports.last!.count)
    }
}
