import Foundation
import Glibc
import KeyholdClient
import KeyholdCore

/// Issue 10: rotate latency (policy none, client library, the body returns at once) and the
/// wall time of 8 concurrent `keyhold rotate` processes of one item (one runs its command,
/// the others wait for its lease and take its result).
@MainActor func measureRotation() {
    let service = "rotate.example", account = "bench"
    try? vault.add(value, service: service, account: account)
    var times: [Double] = []
    for i in 0..<1_000 {
        let t0 = now()
        let r = try! vault.rotate(service: service, account: account) { _ in SecureBytes(copying: Array("token-\(i)".utf8)) }
        times.append(now() - t0)
        r.secret.wipe()
    }
    report("rotate, client library, policy none: p50 / p99", "\(ms(percentile(times, 0.5))) / \(ms(percentile(times, 0.99)))",
           "(release + update, one fsynced commit each)")
    let cli = bin + "/keyhold"
    var bursts: [Double] = []
    for _ in 0..<10 {
        let t0 = now()
        DispatchQueue.concurrentPerform(iterations: 8) { _ in
            _ = run(cli, ["--socket", socketPath, "rotate", service, account, "--print", "--", "/bin/sh", "-c", "cat >/dev/null; printf next"])
        }
        bursts.append(now() - t0)
    }
    report("8 concurrent rotates of one item (CLI processes): p50 / max", "\(ms(percentile(bursts, 0.5))) / \(ms(bursts.max()!))",
           "(10 bursts)")
    try? vault.delete(service: service, account: account)
}
