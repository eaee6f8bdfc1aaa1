import Foundation
import Glibc
import Testing
import KeyholdTestSupport

/// An unprivileged local account starts 32 `keyhold put`s under application passwords at
/// once. Each asks the root broker for an Argon2id derivation of 256 MiB (the real vault's
/// strength); unbounded, that is gigabytes of the broker's memory at once. One derivation per
/// uid runs at a time: the others are *busy* (15, audited) or are served one after another
/// through the client's busy retry, the broker's peak resident memory stays near one
/// derivation's, and every put that succeeded opens with its application password.
@Suite(.serialized) struct AppPasswordFloodTests {
    static let puts = 32
    static let derivationBytes = 256 << 20

    /// The broker's peak resident set (VmHWM) in bytes, from /proc.
    static func peakResident(_ pid: Int32) -> Int? {
        guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
              let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmHWM:") }),
              let kib = Int(line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first ?? "") else { return nil }
        return kib * 1024
    }

    @Test func parallelAppPasswordPutsOfOneUserDeriveOneAtATime() throws {
        let user = try TestUser(prefix: "khp")
        let b = try BrokerFixture()
        let ask = b.askpass(answering: "item-pw", name: "flood-askpass")
        let before = try #require(Self.peakResident(b.pid))
        #expect(before < Self.derivationBytes, "the broker has not derived anything yet")

        final class Statuses: @unchecked Sendable {
            let lock = NSLock()
            var value: [Int: Int32] = [:]
        }
        let statuses = Statuses()
        let threads = (0..<Self.puts).map { i in
            Thread {
                let r = b.cli(["put", "flood", "a\(i)", "--policy", "none+app-password"], stdin: Array("v\(i)".utf8),
                              environment: ["KEYHOLD_ASKPASS": ask], asUser: user.name)
                statuses.lock.lock()
                statuses.value[i] = r.status
                statuses.lock.unlock()
            }
        }
        threads.forEach { $0.start() }
        for _ in 0..<6000 {
            statuses.lock.lock()
            let n = statuses.value.count
            statuses.lock.unlock()
            if n == Self.puts { break }
            usleep(20_000)
        }
        let result = statuses.lock.withLock { statuses.value }
        #expect(result.count == Self.puts, "every put ended")
        #expect(result.values.allSatisfy { $0 == 0 || $0 == 15 }, "\(result.values.sorted())")
        let stored = result.filter { $0.value == 0 }.map(\.key).sorted()
        #expect(!stored.isEmpty, "derivations one after another still store items")

        // Unbounded, 32 derivations ran at once (gigabytes); the vault-wide bound alone lets two
        // run (two derivations' worth); one per uid at a time, one's worth.
        let peak = try #require(Self.peakResident(b.pid))
        #expect(peak >= Self.derivationBytes, "a derivation ran in the broker (peak \(peak >> 20) MiB)")
        #expect(peak < before + Self.derivationBytes * 3 / 2, "peak \(peak >> 20) MiB")

        // What was stored opens with its application password; what was refused is not there.
        for i in stored.prefix(3) {
            let got = b.cli(["get", "flood", "a\(i)"], environment: ["KEYHOLD_ASKPASS": ask], asUser: user.name)
            #expect(got.status == 0)
            expectSecret(got.stdoutText, equals: "v\(i)")
        }
        if let refused = result.first(where: { $0.value == 15 })?.key {
            #expect(b.cli(["get", "flood", "a\(refused)"], environment: ["KEYHOLD_ASKPASS": ask], asUser: user.name).status == 3, "not found")
            let audit = b.cli(["audit", "--json"], asUser: user.name).stdoutText
            #expect(audit.contains("\"outcome\":\"busy\""), "busy puts are audited")
        }
    }
}
