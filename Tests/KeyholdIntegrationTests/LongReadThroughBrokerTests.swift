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

    /// A verify opens its reader at each verify, under the checks every reader is opened with:
    /// while another file is at the WAL's path (the writer keeps its own), that open is refused,
    /// the broker logs it, and the verify runs on the shared long-read reader, which still has
    /// the writer's files, and counts every entry. With the file put back, verifies open their
    /// own reader again (no second log line).
    @Test func aVerifyWhoseReaderIsRefusedIsLoggedAndReadOnTheSharedReader() throws {
        let b = try BrokerFixture()
        let vault = Vault(socketPath: b.socketPath)
        for i in 0..<3 { try vault.add(ReaderThroughBrokerTests.bytes("v\(i)"), service: "verify", account: "a\(i)") }
        let line = "no read-only connection for an audit verify (the file at the vault's path is not the one the broker opened); it runs on the shared long-read reader"
        let first = try vault.verifyAudit()
        #expect(first.verified)
        #expect(!b.brokerLog.contains(line))

        let wal = b.stateDirectory + "/vault.db-wal"
        #expect(rename(wal, wal + ".real") == 0)
        #expect(runCommand("/bin/cp", ["-p", wal + ".real", wal]).status == 0)
        let refused = try vault.verifyAudit()
        #expect(rename(wal + ".real", wal) == 0)
        #expect(refused.verified)
        #expect(refused.count == first.count + 1)  // the first verify's own entry
        #expect(b.brokerLog.components(separatedBy: line).count == 2, "\(b.brokerLog)")

        let after = try vault.verifyAudit()
        #expect(after.verified && after.count == first.count + 2)
        #expect(b.brokerLog.components(separatedBy: line).count == 2)
    }

    /// A user's `audit --follow` numbers the entries it streams among their own, 1, 2, 3 …, with
    /// no gap where others acted, across its polls (each poll numbers on from the last entry it
    /// sent instead of reading the whole log again).
    @Test func aUsersFollowNumbersAmongTheirOwnAcrossPolls() throws {
        let user = try TestUser()
        let b = try BrokerFixture()
        #expect(b.cli(["put", "mine", "x"], stdin: [2], asUser: user.name).status == 0)
        let log = b.directory + "/follow.out"
        let follow = try SpawnedProcess.spawn("/usr/bin/setpriv", ["--reuid=\(user.name)", "--regid=\(user.name)", "--init-groups", "--",
                                                                   TestPaths.keyhold, "--socket", b.socketPath, "audit", "--json", "--follow"],
                                              environment: [:], log: log)
        defer { follow.stop() }
        func streamed() -> [Int] {
            ((try? String(contentsOfFile: log, encoding: .utf8)) ?? "").split(separator: "\n").compactMap {
                ((try? JSONSerialization.jsonObject(with: Data($0.utf8))) as? [String: Any])?["seq"] as? Int
            }
        }
        func waitFor(_ count: Int) -> Bool {
            for _ in 0..<600 where streamed().count < count { usleep(50_000) }
            return streamed().count >= count
        }
        #expect(waitFor(2))  // the put and the follow's own audit read
        for round in 0..<3 {
            for i in 0..<5 { b.cli(["put", "root-\(round)-\(i)", "x"], stdin: [1]) }  // others act between
            #expect(b.cli(["get", "mine", "x"], asUser: user.name).status == 0)
            #expect(waitFor(3 + round), "round \(round): \(streamed())")
        }
        #expect(streamed() == [1, 2, 3, 4, 5], "\(streamed())")
    }
}
