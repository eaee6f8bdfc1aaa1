import Foundation
import Glibc
import Synchronization
import Testing
import KeyholdClient
import KeyholdCore
import KeyholdProtocol
import KeyholdTestSupport

/// Group commit seen from callers of the real broker: what a caller was told happened is
/// durable, even when the broker is killed mid-burst, and a caller that hangs up is audited.
@Suite struct GroupCommitThroughBrokerTests {
    @Test func killNineDuringABurstLosesNoAcknowledgedWrite() throws {
        let b = try BrokerFixture()
        let vault = Vault(socketPath: b.socketPath)
        try vault.add(SecureBytes(copying: Array("seed".utf8)), service: "burst", account: "seed")
        let acknowledgedPuts = Mutex<[String]>([])
        let acknowledgedGets = Mutex<[String]>([])
        let stop = Atomic<Bool>(false)
        // Kill once the burst is well under way (64 acknowledged puts), however loaded the machine.
        let killer = Thread {
            for _ in 0..<2_000 where acknowledgedPuts.withLock({ $0.count }) < 64 { usleep(10_000) }
            b.kill9()
            stop.store(true, ordering: .relaxed)
        }
        killer.start()
        runThreads(16) { t in
            let v = Vault(socketPath: b.socketPath)
            var n = 0
            while !stop.load(ordering: .relaxed) && n < 2_000 {
                n += 1
                let account = "t\(t)-\(n)"
                if (try? v.add(SecureBytes(copying: Array("value-\(account)".utf8)), service: "burst", account: account)) != nil {
                    acknowledgedPuts.withLock { $0.append(account) }
                }
                let reason = "get-\(account)"
                if let s = try? v.secret(service: "burst", account: "seed", reason: reason) {
                    s.wipe()
                    acknowledgedGets.withLock { $0.append(reason) }
                }
            }
        }
        try b.start()
        let puts = acknowledgedPuts.withLock { $0 }, gets = acknowledgedGets.withLock { $0 }
        #expect(puts.count >= 64, "the burst did some work before the kill (\(puts.count) puts)")
        for account in puts {
            let s = try vault.secret(service: "burst", account: account)
            expectSecret(String(decoding: s.withUnsafeBytes { Array($0) }, as: UTF8.self), equals: "value-\(account)")
            s.wipe()
        }
        var reasons = Set<String>()
        try vault.auditEntries { batch in
            for e in batch { if let r = e.readable.reason { reasons.insert(r) } }
            return true
        }
        let missing = gets.filter { !reasons.contains($0) }
        #expect(missing.isEmpty, "released without a durable audit entry: \(missing.prefix(5))")
        #expect(try vault.verifyAudit().verified)
    }

    /// A get whose caller hangs up before the answer is still decided and audited.
    @Test func aCallerThatHangsUpIsStillAudited() throws {
        let b = try BrokerFixture()
        let vault = Vault(socketPath: b.socketPath)
        try vault.add(SecureBytes(copying: Array("v".utf8)), service: "gone", account: "a")
        runThreads(8) { i in
            let fd = connectUnixSocket(b.socketPath)
            guard fd >= 0 else { return }
            var r = Request(.get, item: ItemReference(service: "gone", account: "a"))
            r.reason = "hung-up-\(i)"
            r.allowInteraction = false
            try? Frame.write(ClientMessage.request(r).encode(), to: fd)
            close(fd)
        }
        var seen = Set<String>()
        for _ in 0..<100 {
            seen.removeAll()
            try vault.auditEntries(item: (service: "gone", account: "a")) { batch in
                for e in batch { if let r = e.readable.reason, r.hasPrefix("hung-up-") { seen.insert(r) } }
                return true
            }
            if seen.count == 8 { break }
            usleep(100_000)
        }
        #expect(seen.count == 8, "audited: \(seen.sorted())")
    }
}
