import Foundation
import Glibc
import KeyholdClient
import KeyholdCore
import KeyholdVault

// keyhold-bench: latency, throughput, size and memory of a real broker on a temporary vault.
// Run on demand (README: "Benchmark"), never in CI. Prints a table of percentiles and ratios.
//   keyhold-bench [--items N] [--audit-entries N] | --tpm-cost-only | --verify-state DIR
//     | --fill-state DIR --owner UID --from A --to B (Secret Service benchmark's items)
//     | --seed-audit DIR --entries N (a log to profile `--verify-state` on)
//     | --throughput-only (the concurrent get table alone) | --search-only (the search rows alone)
// Defaults: 100,000 items, 1,000,000 audit entries.

let args = CommandLine.arguments
let help = """
    usage: keyhold-bench [--items N] [--audit-entries N] | --throughput-only | --search-only
                         | --tpm-cost-only | --verify-state DIR [--repeat N]
                         | --fill-state DIR --owner UID --from A --to B | --seed-audit DIR --entries N

    Latency, throughput, size and memory of a real broker on a temporary vault (defaults:
    100,000 items, 1,000,000 audit entries); prints a table. Run from a release build
    (scripts/bench.sh); docs/BENCHMARKS.md says what each row means.
    """
if let answer = KeyholdVersion.standardAnswer(Array(args.dropFirst()), program: "keyhold-bench", help: help) {
    print(answer, terminator: "")
    exit(0)
}
func option(_ name: String, _ fallback: Int) -> Int {
    guard let i = args.firstIndex(of: name), i + 1 < args.count, let v = Int(args[i + 1]) else { return fallback }
    return v
}
if let i = args.firstIndex(of: "--fill-state"), i + 1 < args.count {
    fillState(args[i + 1], owner: UInt32(option("--owner", 0)), from: option("--from", 1), to: option("--to", 0))
    exit(0)
}
if let i = args.firstIndex(of: "--seed-audit"), i + 1 < args.count {
    let store = try! VaultStore.open(stateDirectory: args[i + 1])
    seedAudit(store, from: 0, to: option("--entries", 1_000_000))
    store.close()
    exit(0)
}
if let i = args.firstIndex(of: "--verify-state"), i + 1 < args.count {
    verifyExisting(args[i + 1], repeats: option("--repeat", 3))
    exit(0)
}
let maxItems = option("--items", 100_000)
let auditEntries = option("--audit-entries", 1_000_000)
let bin = URL(fileURLWithPath: (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? args[0])
    .deletingLastPathComponent().path

func now() -> Double { Double(MonotonicClock.nanoseconds()) / 1e9 }

func percentile(_ xs: [Double], _ p: Double) -> Double {
    let s = xs.sorted()
    guard !s.isEmpty else { return .nan }
    return s[min(s.count - 1, Int(Double(s.count) * p))]
}

func ms(_ x: Double) -> String { String(format: "%.3f ms", x * 1000) }

var rows: [(String, String, String)] = []
@MainActor func report(_ what: String, _ value: String, _ target: String) {
    rows.append((what, value, target))
    print(String(format: "%-58@ %-22@ %@", what as NSString, value as NSString, target as NSString))
}

func rss(_ pid: Int32) -> Int {
    let status = (try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)) ?? ""
    let line = status.split(separator: "\n").first { $0.hasPrefix("VmRSS:") } ?? ""
    return Int(line.split(separator: " ").dropFirst().first ?? "") ?? -1
}

// `--tpm-cost-only`: just the TPM key protector's cost (TPMCost.swift), a minute instead of the whole run.
if args.contains("--tpm-cost-only") {
    measureTPMCost(bin: bin)
    exit(0)
}

// A broker on a temporary vault.
var template = Array("/tmp/khbench-XXXXXX".utf8CString)
let dir = String(cString: mkdtemp(&template)!)
defer { try? FileManager.default.removeItem(atPath: dir) }
let state = dir + "/state", socketPath = dir + "/k.sock"
let broker = Process()
broker.executableURL = URL(fileURLWithPath: bin + "/keyholdd")
broker.arguments = ["--state-dir", state, "--socket", socketPath, "--fprint-state-dir", dir, "--key-protector", "file"]
broker.standardError = FileHandle.nullDevice
try! broker.run()
let vault = Vault(socketPath: socketPath)
for _ in 0..<500 where (try? vault.items()) == nil { usleep(10_000) }

print("Keyhold benchmark — \(ProcessInfo.processInfo.processorCount) cores, items up to \(maxItems), build: \(bin)")
print(String(repeating: "-", count: 100))

let value = SecureBytes(copying: Array(repeating: UInt8(ascii: "t"), count: 64))
var stored = 0
var putTimes: [Double] = []
@MainActor func fill(to n: Int) {
    putTimes.removeAll(keepingCapacity: true)
    while stored < n {
        let t0 = now()
        try! vault.add(value, service: "bench.example", account: "user-\(stored)")
        putTimes.append(now() - t0)
        stored += 1
    }
}

@MainActor func measureGets(_ samples: Int) -> [Double] {
    var times: [Double] = []
    for i in 0..<samples {
        let account = "user-\(Int.random(in: 0..<stored))"
        let t0 = now()
        let s = try! vault.secret(service: "bench.example", account: account)
        times.append(now() - t0)
        s.wipe()
        _ = i
    }
    return times
}

/// `keyhold get` and `keyhold put` as separate processes, as a script would run them.
@MainActor func measureCLI(_ label: String, getTarget: String = "", putTarget: String = "") {
    var cliGet: [Double] = [], cliPut: [Double] = []
    for i in 0..<100 {
        let t0 = now()
        _ = run(bin + "/keyhold", ["--socket", socketPath, "get", "bench.example", "user-\(Int.random(in: 0..<stored))"])
        cliGet.append(now() - t0)
        let t1 = now()
        _ = run(bin + "/keyhold", ["--socket", socketPath, "put", "cli-\(label).example", "n\(i)"], stdin: Array("cli-value".utf8))
        cliPut.append(now() - t1)
    }
    report("get, CLI process, at \(label) items: p50 / p99", "\(ms(percentile(cliGet, 0.5))) / \(ms(percentile(cliGet, 0.99)))", getTarget)
    report("put, CLI process, at \(label) items: p50 / p99", "\(ms(percentile(cliPut, 0.5))) / \(ms(percentile(cliPut, 0.99)))", putTarget)
}

/// `keyhold get` beside its floors, in the same run and interleaved sample by sample so load
/// on the machine hits every row alike: the C floor (Floor.swift), `/bin/true`, and
/// `secret-tool lookup` / `pass show` when installed and usable here.
@MainActor func compareCLIWithFloors(_ label: String, samples: Int = 300) {
    let floorDir = dir + "/floor"
    mkdir(floorDir, 0o700)
    var commands: [(name: String, path: String, args: () -> [String], env: [String]?)] = []
    let account = { "user-\(Int.random(in: 0..<min(stored, 10_000)))" }
    commands.append(("keyhold get", bin + "/keyhold", { ["--socket", socketPath, "get", "bench.example", account()] }, nil))
    if let floor = Floor.build(in: floorDir, items: min(stored, 10_000)) {
        commands.append(("C floor (libsodium + SQLite lookup)", floor, { Floor.getArguments(in: floorDir, account: account()) }, nil))
    }
    commands.append(("/bin/true", "/bin/true", { [] }, nil))
    let secretTool = OtherStores.secretTool(in: floorDir)
    defer { secretTool?.stop() }
    if let other = secretTool?.command { commands.append(("secret-tool lookup", other.path, other.args, other.env)) }
    if let other = OtherStores.pass(in: floorDir) { commands.append(("pass show", other.path, other.args, other.env)) }
    var times = Array(repeating: [Double](), count: commands.count)
    for _ in 0..<samples {
        for (i, c) in commands.enumerated() { times[i] += spawnTimes(1, c.path, c.args, environment: c.env) }
    }
    let p50s = times.map { percentile($0, 0.5) }
    let floorP50 = commands.count > 1 && commands[1].name.hasPrefix("C floor") ? p50s[1] : Double.nan
    for (i, c) in commands.enumerated() {
        let ratio = floorP50.isNaN ? "" : String(format: "%.2fx the C floor", p50s[i] / floorP50)
        let target = i == 0 ? ratio + (ratio.isEmpty ? "" : "; target <= 1.5x") : ratio
        report("\(c.name) at \(label) items: p50 / p99", "\(ms(p50s[i])) / \(ms(percentile(times[i], 0.99)))", target)
    }
}

/// More puts at the current size, timed one by one.
@MainActor func measurePuts(_ samples: Int) -> [Double] {
    var times: [Double] = []
    for i in 0..<samples {
        let t0 = now()
        try! vault.add(value, service: "bench-put-\(stored).example", account: "p\(i)")
        times.append(now() - t0)
    }
    return times
}

fill(to: min(1_000, maxItems))
let put1k = putTimes  // the puts that filled the store to 1,000
let get1k = measureGets(2_000)
report("put, client library, at 1,000 items: p50 / p99", "\(ms(percentile(put1k, 0.5))) / \(ms(percentile(put1k, 0.99)))", "(each put is fsynced)")
report("get, client library, at 1,000 items: p50 / p99", "\(ms(percentile(get1k, 0.5))) / \(ms(percentile(get1k, 0.99)))", "target p50 < 1 ms")
/// A search of every item, and other callers' gets while one searches, lists or verifies in a loop.
@MainActor func reportSearch() {
    let long = measureLongReads(socketPath: socketPath, items: stored)
    report("search matching all \(stored) items (client library), best of 3", ms(long.best), "")
    func p50p99(_ xs: [Double]) -> String { "\(ms(percentile(xs, 0.5))) / \(ms(percentile(xs, 0.99)))" }
    report("get while another client searches / lists / verifies the audit in a loop: p50 / p99",
           "\(p50p99(long.searching)) · \(p50p99(long.listing)) · \(p50p99(long.verifying))", "quiet: \(p50p99(long.quiet))")
}
if args.contains("--search-only") {
    // The search and long-read rows alone, at --items (at most 10,000), for comparing builds.
    fill(to: min(maxItems, 10_000))
    reportSearch()
    broker.terminate()
    broker.waitUntilExit()
    try? FileManager.default.removeItem(atPath: dir)
    exit(0)
}
if args.contains("--throughput-only") {
    // The throughput table alone (with CPU per get), for profiling the broker beside it.
    reportThroughput(socketPath: socketPath, items: stored, brokerPID: broker.processIdentifier)
    broker.terminate()
    broker.waitUntilExit()
    try? FileManager.default.removeItem(atPath: dir)  // exit() skips the top-level defer
    exit(0)
}
measureCLI("1,000")
measureRotation()
reportThroughput(socketPath: socketPath, items: stored, brokerPID: broker.processIdentifier)

if maxItems >= 10_000 {
    fill(to: 10_000)
    measureCLI("10,000", getTarget: "target p50 <= 8 ms", putTarget: "target p50 <= 12 ms")
}
compareCLIWithFloors("\(stored)")

if maxItems > 10_000 {
    let t0 = now()
    fill(to: maxItems)
    let fillTime = now() - t0
    report("put, client library, filling to \(maxItems): p50 / p99", "\(ms(percentile(putTimes, 0.5))) / \(ms(percentile(putTimes, 0.99)))", String(format: "(%.0f s to fill)", fillTime))
}
let putN = measurePuts(1_000)
let getN = measureGets(2_000)
report("put, client library, at \(stored) items: p50 / p99", "\(ms(percentile(putN, 0.5))) / \(ms(percentile(putN, 0.99)))", "(each put is fsynced)")
report("get, client library, at \(stored) items: p50 / p99", "\(ms(percentile(getN, 0.5))) / \(ms(percentile(getN, 0.99)))", "target p99 <= 5 ms")
report("get p50 ratio, \(stored) items vs 1,000", String(format: "%.2fx", percentile(getN, 0.5) / percentile(get1k, 0.5)), "target <= 1.5x")

if stored > 10_000 { measureCLI("\(stored)") }

var listTimes: [Double] = []
for _ in 0..<3 {
    let t0 = now()
    let n = try! vault.items().count
    listTimes.append(now() - t0)
    precondition(n >= stored)
}
report("list of \(stored) items (client library), best of 3", ms(listTimes.min()!), "target < 500 ms")
reportSearch()

let files = ["vault.db", "vault.db-wal"].map { state + "/" + $0 }
let bytes = files.reduce(0) { $0 + ((try? FileManager.default.attributesOfItem(atPath: $1)[.size] as? Int) ?? 0) }
report("database size per item (db + wal, incl. audit rows)", "\(bytes / max(stored, 1)) bytes", "")
report("broker RSS at \(stored) items", "\(rss(broker.processIdentifier) / 1024) MiB", "target < 64 MiB")
let libraries = mappedLibraries(broker.processIdentifier)
print("broker maps \(libraries.count) shared libraries: \(libraries.joined(separator: " "))")

measureCredentialHelpers()

broker.terminate()
broker.waitUntilExit()

// Audit: append cost and verification speed, on the store directly (the broker's own code path).
if auditEntries > 0 {
    let auditDir = dir + "/audit"
    let store = try! VaultStore.open(stateDirectory: auditDir)
    // The append cost: each entry its own fsynced commit, as a lone caller's is.
    let timed = min(auditEntries, 5_000)
    var appendTimes: [Double] = []
    appendTimes.reserveCapacity(timed)
    for i in 0..<timed {
        let a = now()
        try! store.append(benchAuditEntry(i))
        appendTimes.append(now() - a)
    }
    report("audit append (store, committed), p50 / p99", "\(ms(percentile(appendTimes, 0.5))) / \(ms(percentile(appendTimes, 0.99)))", "\(timed) entries, one commit each")
    seedAudit(store, from: timed, to: auditEntries)
    let v0 = now()
    let verification = try! store.verifyAudit()
    let vt = now() - v0
    report("audit verify of \(auditEntries) entries", String(format: "%.2f s", vt), String(format: "%.0f entries/s; %@%@", Double(auditEntries) / vt, "\(verification)" as NSString,
                                                                         auditEntries == 1_000_000 ? "; target < 5 s" : ""))
    store.close()
}
measureTPMCost(bin: bin)  // issue 13: what the TPM key protector adds (TPMCost.swift)
print(String(repeating: "-", count: 100))
