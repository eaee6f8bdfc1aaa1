import Foundation
import Glibc
import KeyholdClient
import KeyholdCore
import KeyholdVault

/// What the TPM key protector adds: the same broker with `--key-protector file` and with
/// `--key-protector tpm` on Debian's swtpm (a real TPM is slower per command: tens of ms for
/// an unseal, so these figures are lower bounds). The TPM is used at start (unseal, counter
/// check), for changes that matter for rollback (`put --update` and rm here: one NV increment
/// each), and, for any request, to re-read the counter when the broker's cached value is over
/// 1 s old (RollbackWatch.swift); every store access also compares the vault's counter record
/// with that cached value (no TPM command).
@MainActor func measureTPMCost(bin: String, samples: Int = 300) {
    let swtpm = "/usr/bin/swtpm"
    guard access(swtpm, X_OK) == 0 else {
        report("TPM key protector cost", "skipped", "swtpm not installed (scripts/setup.sh)")
        return
    }
    var template = Array("/tmp/khtpmb-XXXXXX".utf8CString)
    let dir = String(cString: mkdtemp(&template)!)
    defer { try? FileManager.default.removeItem(atPath: dir) }
    mkdir(dir + "/tpm", 0o700)
    let tpmSocket = dir + "/tpm.sock"
    let tpm = Process()
    tpm.executableURL = URL(fileURLWithPath: swtpm)
    tpm.arguments = ["socket", "--tpmstate", "dir=\(dir)/tpm", "--server", "type=unixio,path=\(tpmSocket)",
                     "--ctrl", "type=unixio,path=\(tpmSocket).ctrl", "--flags", "not-need-init,startup-clear", "--tpm2"]
    tpm.standardOutput = FileHandle.nullDevice
    tpm.standardError = FileHandle.nullDevice
    try! tpm.run()
    defer { tpm.terminate(); tpm.waitUntilExit() }
    for _ in 0..<500 where access(tpmSocket + ".ctrl", F_OK) != 0 { usleep(10_000) }

    var results: [String: (start: Double, put: Double, update: Double, rm: Double, get: Double)] = [:]
    for protector in ["file", "tpm"] {
        let state = dir + "/state-" + protector, socket = dir + "/broker-\(protector).sock"
        let arguments = ["--state-dir", state, "--socket", socket, "--fprint-state-dir", dir,
                         "--key-protector", protector, "--tpm-tcti", "swtpm:path=\(tpmSocket)"]
        /// Spawn to first answered request; the first start also creates the vault (and seals).
        func start() -> (Process, Double) {
            let p = Process()
            p.executableURL = URL(fileURLWithPath: bin + "/keyholdd")
            p.arguments = arguments
            p.standardError = FileHandle.nullDevice
            let t0 = now()
            try! p.run()
            let v = Vault(socketPath: socket)
            for _ in 0..<5000 {
                if (try? v.items()) != nil { break }
                usleep(2_000)
            }
            return (p, now() - t0)
        }
        let (first, _) = start()
        first.terminate(); first.waitUntilExit()
        var starts: [Double] = []
        var broker: Process? = nil
        for i in 0..<5 {
            let (p, t) = start()
            starts.append(t)
            if i < 4 { p.terminate(); p.waitUntilExit() } else { broker = p }
        }
        let vault = Vault(socketPath: socket)
        var puts: [Double] = [], gets: [Double] = [], updates: [Double] = [], rms: [Double] = []
        let value = SecureBytes(copying: Array(repeating: UInt8(ascii: "t"), count: 64))
        for i in 0..<samples {
            var t0 = now()
            try! vault.add(value, service: "tpm-bench.example", account: "a\(i)")
            puts.append(now() - t0)
            t0 = now()
            try! vault.secret(service: "tpm-bench.example", account: "a\(i)").wipe()
            gets.append(now() - t0)
        }
        for i in 0..<samples {
            let t0 = now()
            try! vault.update(value, service: "tpm-bench.example", account: "a\(i)")
            updates.append(now() - t0)
        }
        for i in 0..<samples {
            let t0 = now()
            try! vault.delete(service: "tpm-bench.example", account: "a\(i)")
            rms.append(now() - t0)
        }
        broker?.terminate(); broker?.waitUntilExit()
        results[protector] = (percentile(starts, 0.5), percentile(puts, 0.5), percentile(updates, 0.5), percentile(rms, 0.5),
                              percentile(gets, 0.5))
    }
    let f = results["file"]!, t = results["tpm"]!
    func line(_ what: String, _ a: Double, _ b: Double, _ note: String = "") {
        report("TPM cost, \(what), p50 file / tpm (swtpm)", "\(ms(a)) / \(ms(b))", String(format: "%+.3f ms", (b - a) * 1000) + note)
    }
    line("broker start-up (existing vault)", f.start, t.start)
    line("put (new item)", f.put, t.put, " (record check; a TPM read at most once a second)")
    line("put --update", f.update, t.update, " (advances the TPM rollback counter)")
    line("rm", f.rm, t.rm, " (advances the TPM rollback counter)")
    line("get", f.get, t.get, " (record check; a TPM read at most once a second)")
}
