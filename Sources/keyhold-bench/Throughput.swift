import Foundation
import Glibc
import KeyholdClient
import KeyholdCore

/// Concurrent `get` throughput: `clients` threads, each with its own client, doing gets of
/// random `policy none` items for `seconds`. Every get is a real request through the socket
/// whose audit entry is committed before the secret is sent (group commit shares the fsync).
func measureThroughput(socketPath: String, items: Int, clients: Int, seconds: Double) -> (perSecond: Double, p50: Double, p99: Double) {
    final class Results: @unchecked Sendable {
        let lock = NSLock()
        var latencies: [Double] = []
        var failures = 0
        var finished = 0
    }
    let results = Results()
    // Time for every client's first get (not counted): each thread is running when the clock starts.
    let start = now() + 0.25
    let end = start + seconds
    var threads: [Thread] = []
    for _ in 0..<clients {
        let t = Thread {
            let vault = Vault(socketPath: socketPath)
            // Items picked by a generator seeded once per thread: `Int.random` asks the kernel
            // (getrandom) on every call, client CPU the table would count as Keyhold's.
            var system = SystemRandomNumberGenerator()
            var picks: UInt64 = system.next()
            var mine: [Double] = []
            var failed = 0
            if let first = try? vault.secret(service: "bench.example", account: "user-0") { first.wipe() }
            while now() < start { usleep(1_000) }
            while true {
                let t0 = now()
                if t0 >= end { break }
                do {
                    let s = try vault.secret(service: "bench.example", account: "user-\(Int(splitMix64(&picks) % UInt64(items)))")
                    s.wipe()
                    mine.append(now() - t0)
                } catch {
                    failed += 1
                }
            }
            results.lock.lock()
            results.latencies += mine
            results.failures += failed
            results.finished += 1
            results.lock.unlock()
        }
        t.stackSize = 1 << 20
        threads.append(t)
    }
    for t in threads { t.start() }
    // Threads stop on their own at `end`; wait until every one has reported.
    while true {
        results.lock.lock()
        let finished = results.finished
        results.lock.unlock()
        if finished == clients { break }
        usleep(10_000)
    }
    results.lock.lock()
    defer { results.lock.unlock() }
    precondition(results.failures == 0, "throughput: \(results.failures) gets failed")
    return (Double(results.latencies.count) / seconds, percentile(results.latencies, 0.5), percentile(results.latencies, 0.99))
}

/// SplitMix64: the next value of a small generator, enough to spread gets over the items.
func splitMix64(_ state: inout UInt64) -> UInt64 {
    state &+= 0x9E37_79B9_7F4A_7C15
    var z = state
    z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
    z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
    return z ^ (z >> 31)
}

/// The table the README's benchmark section names: gets/s at 1, 24 and 64 clients beside the
/// need-based targets (docs/ARCHITECTURE.md, "Targets"), and the CPU each get costs the broker
/// and the client threads. The clients are this process's (one uid); a get that fails, *busy*
/// after the client library's retries included, stops the run.
@MainActor func reportThroughput(socketPath: String, items: Int, brokerPID: Int32) {
    var single = 0.0
    for clients in [1, 24, 64] {
        let broker0 = cpuSeconds(pid: brokerPID), own0 = cpuSeconds(pid: getpid()), machine0 = MachineTicks.now()
        let r = measureThroughput(socketPath: socketPath, items: items, clients: clients, seconds: 3)
        let gets = r.perSecond * 3
        let brokerCPU = (cpuSeconds(pid: brokerPID) - broker0) / gets, clientCPU = (cpuSeconds(pid: getpid()) - own0) / gets
        let machine = MachineTicks.now().since(machine0)
        if clients == 1 { single = r.perSecond }
        let target = clients == 24 ? "target >= 2,000 gets/s, p99 < 50 ms, no busy"
            : clients == 64 ? "target: no slower than 1 client" : ""
        report("get throughput, \(clients) client\(clients == 1 ? "" : "s"): gets/s (x 1 client), p50 / p99",
               String(format: "%.0f (%.1fx) %@ / %@", r.perSecond, r.perSecond / single, ms(r.p50) as NSString, ms(r.p99) as NSString),
               target)
        report("  CPU per get at \(clients): broker / client threads", String(format: "%.0f / %.0f us", brokerCPU * 1e6, clientCPU * 1e6),
               String(format: "(machine idle %.0f%%, stolen by the host %.0f%%)", machine.idle * 100, machine.steal * 100))
    }
}

/// The whole machine's CPU time from /proc/stat's first line: how much of a measurement the
/// cores sat idle (idle and iowait: every thread waiting, e.g. for a group's fsync) and how much
/// the hypervisor took (steal), which explains a rate below what "2 cores allow".
struct MachineTicks {
    var idle = 0.0, steal = 0.0, total = 0.0

    static func now() -> MachineTicks {
        guard let text = try? String(contentsOfFile: "/proc/stat", encoding: .utf8),
              let line = text.split(separator: "\n").first, line.hasPrefix("cpu ") else { return MachineTicks() }
        // user nice system idle iowait irq softirq steal (guest time is already in user)
        let v = line.split(separator: " ").dropFirst().prefix(8).compactMap { Double($0) }
        guard v.count == 8 else { return MachineTicks() }
        return MachineTicks(idle: v[3] + v[4], steal: v[7], total: v.reduce(0, +))
    }

    /// Shares of the time between `earlier` and this reading (0 when nothing was counted).
    func since(_ earlier: MachineTicks) -> MachineTicks {
        let total = self.total - earlier.total
        guard total > 0 else { return MachineTicks() }
        return MachineTicks(idle: (idle - earlier.idle) / total, steal: (steal - earlier.steal) / total, total: total)
    }
}

/// User + system CPU seconds a process has used so far (/proc/PID/stat fields 14 and 15).
func cpuSeconds(pid: Int32) -> Double {
    guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
          let close = stat.lastIndex(of: ")") else { return 0 }
    let fields = stat[stat.index(after: close)...].split(separator: " ")
    guard fields.count > 13, let user = Double(fields[11]), let system = Double(fields[12]) else { return 0 }
    return (user + system) / Double(sysconf(Int32(_SC_CLK_TCK)))
}
