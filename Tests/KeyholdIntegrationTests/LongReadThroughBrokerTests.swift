import Foundation
import Glibc
import Synchronization
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

    /// Two unprivileged accounts and root verify the chain in loops at the same time through
    /// the socket, while a third account lists: every verify is served and intact (a busy
    /// answer, at a bound, is asked again by the client), each verify's entry carries the uid the
    /// kernel gave its connection, and an account's audit shows its own verifies and no one
    /// else's, and none is *busy*.
    @Test func accountsVerifyingAtOnceAreEachServedAndAuditedAsThemselves() throws {
        let (a, c, lister) = (try TestUser(), try TestUser(), try TestUser())
        let b = try BrokerFixture()
        for user in [a, c, lister] {
            #expect(b.cli(["put", "own", user.name], stdin: Array("v-\(user.name)".utf8), asUser: user.name).status == 0)
        }
        let rounds = 8
        let accounts: [String?] = [a.name, c.name, nil]
        let failures = Mutex<[String]>([])
        runThreads(accounts.count + 1) { i in
            for _ in 0..<rounds {
                if i < accounts.count {
                    let r = b.cli(["audit", "verify"], asUser: accounts[i])
                    if r.status != 0 || !r.stdoutText.contains("audit chain verified") {
                        failures.withLock { $0.append("\(accounts[i] ?? "root"): \(r.status) \(r.stdoutText) \(r.stderr)") }
                    }
                } else {
                    let r = b.cli(["ls"], asUser: lister.name)
                    if r.status != 0 { failures.withLock { $0.append("ls: \(r.status) \(r.stderr)") } }
                }
            }
        }
        #expect(failures.withLock { $0 }.isEmpty, "\(failures.withLock { $0 })")
        func verifies(_ rows: [[String: Any]], uid: UInt32) -> [String] {
            rows.filter { $0["operation"] as? String == "audit-verify" && $0["uid"] as? Int == Int(uid) }.compactMap { $0["outcome"] as? String }
        }
        let all = b.cli(["audit", "--json"]).stdoutText.split(separator: "\n")
            .compactMap { try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] }
        for user in [a, c] {
            #expect(verifies(all, uid: user.uid).filter { $0 == "ok" }.count == rounds, "\(user.name): \(verifies(all, uid: user.uid))")
            let own = b.cli(["audit", "--json"], asUser: user.name).stdoutText.split(separator: "\n")
                .compactMap { try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] }
            #expect(!own.isEmpty && own.allSatisfy { $0["uid"] as? Int == Int(user.uid) }, "\(user.name) sees others' entries")
            #expect(verifies(own, uid: user.uid).filter { $0 == "ok" }.count == rounds)
        }
        #expect(verifies(all, uid: 0).filter { $0 == "ok" }.count == rounds)
        #expect(verifies(all, uid: lister.uid).isEmpty)
        // Each account's loop is sequential and two accounts and root each have a slot: no one
        // was made to wait for another (no *busy* entry).
        for uid in [a.uid, c.uid, 0] { #expect(verifies(all, uid: uid).allSatisfy { $0 == "ok" }, "\(uid): \(verifies(all, uid: uid))") }
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
