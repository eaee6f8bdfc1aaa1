import Foundation
import Glibc
import KeyholdClient
import KeyholdCore
import Synchronization

/// A search that matches every item (one pair, `service`), and what a long read does to other
/// callers: `get` latency on one client while another searches, lists or verifies the audit
/// log in a loop, beside the same gets with nothing else running.
func measureLongReads(socketPath: String, items: Int, gets: Int = 500)
    -> (best: Double, quiet: [Double], searching: [Double], listing: [Double], verifying: [Double]) {
    let reader = Vault(socketPath: socketPath), getter = Vault(socketPath: socketPath)
    var times: [Double] = []
    for _ in 0..<3 {
        let t0 = now()
        let n = try! reader.search(attributes: ["service": "bench.example"]).count
        times.append(now() - t0)
        precondition(n >= items)
    }
    func timedGets() -> [Double] {
        (0..<gets).map { _ in
            let t0 = now()
            let s = try! getter.secret(service: "bench.example", account: "user-\(Int.random(in: 0..<items))")
            s.wipe()
            return now() - t0
        }
    }
    func timedGets(while loop: @escaping @Sendable () -> Void) -> [Double] {
        let stop = Atomic<Bool>(false)
        let t = Thread { while !stop.load(ordering: .relaxed) { loop() } }
        t.start()
        usleep(50_000)
        let latencies = timedGets()
        stop.store(true, ordering: .relaxed)
        while !t.isFinished { usleep(1_000) }
        return latencies
    }
    let quiet = timedGets()
    let searching = timedGets { _ = try? reader.search(attributes: ["service": "bench.example"]) }
    let listing = timedGets { _ = try? reader.items() }
    let verifying = timedGets { _ = try? reader.verifyAudit() }
    return (times.min()!, quiet, searching, listing, verifying)
}
