import Foundation
import Glibc
import Testing
import KeyholdClient
import KeyholdCore
import KeyholdTestSupport

/// The broker's side of a claim (SessionSecretService.checkClaim), asked directly as a buggy or
/// hostile agent would: a claimed pid that is gone, a zombie, or the agent's "unreadable"
/// marker is refused for every operation — read, search, list, write, delete — and audited
/// under that operation with why; nothing is read, stored or deleted. A live claim works.
@Suite(.serialized) struct BrokerClaimTests {
    /// A child that has exited: reaped (its pid is gone) or not yet (a zombie).
    static func exitedChild(reaped: Bool) -> pid_t {
        var pid: pid_t = 0
        let argv: [UnsafeMutablePointer<CChar>?] = [strdup("/bin/true"), nil]
        defer { free(argv[0]) }
        #expect(posix_spawn(&pid, "/bin/true", nil, nil, argv, environ) == 0)
        if reaped {
            var status: Int32 = 0
            waitpid(pid, &status, 0)
        } else {
            // Exited, not waited for: /proc/PID stays, with no executable to read.
            for _ in 0..<500 {
                if let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8), stat.contains(") Z ") { break }
                usleep(10_000)
            }
        }
        return pid
    }

    @Test func unconfirmedClaimsAreRefusedForEveryOperation() throws {
        let f = try BrokerFixture()
        let vault = Vault(socketPath: f.socketPath)
        try vault.add(SecureBytes(copying: Array("kept".utf8)), service: "claims", account: "ann")
        let zombie = Self.exitedChild(reaped: false)
        defer { var s: Int32 = 0; waitpid(zombie, &s, 0) }
        let claims: [(Int32, String)] = [
            (Self.exitedChild(reaped: true), "via the Secret Service is gone"),
            (zombie, "via the Secret Service cannot be confirmed"),
            (Vault.unreadableClaimedPID, "could not read the sender's credentials"),
        ]
        for (pid, why) in claims {
            func refused(_ what: String, _ body: () throws(KeyholdError) -> Void) {
                do throws(KeyholdError) {
                    try body()
                    Issue.record("\(what) with claimed pid \(pid) was carried out")
                } catch {
                    guard case .notAuthorized = error else { Issue.record("\(what): \(error)"); return }
                }
            }
            refused("get") { () throws(KeyholdError) in _ = try vault.secret(service: "claims", account: "ann", claimedPID: pid) }
            refused("search") { () throws(KeyholdError) in _ = try vault.search(attributes: [:], claimedPID: pid) }
            refused("list") { () throws(KeyholdError) in _ = try vault.items(claimedPID: pid) }
            refused("put") { () throws(KeyholdError) in
                try vault.store(SecureBytes(copying: Array("new".utf8)), service: "claims", account: "bob", label: "",
                                policy: .none, reuseSeconds: 0, update: false, claimedPID: pid)
            }
            refused("update") { () throws(KeyholdError) in
                try vault.store(SecureBytes(copying: Array("replaced".utf8)), service: "claims", account: "ann", label: "",
                                policy: .none, reuseSeconds: 0, update: true, claimedPID: pid)
            }
            refused("delete") { () throws(KeyholdError) in try vault.delete(service: "claims", account: "ann", claimedPID: pid) }
            let rows = f.cli(["audit", "--json"]).stdoutText.split(separator: "\n").filter { $0.contains(why) }
            for op in ["get", "search", "list", "put", "update", "delete"] {
                #expect(rows.contains { $0.contains("\"operation\":\"\(op)\"") && $0.contains("\"decision\":\"denied\"") },
                        "\(op) refused for pid \(pid) is not audited: \(rows)")
            }
        }
        // Nothing changed; a live claim (this process) is carried out and recorded as claimed.
        let items = try vault.items(claimedPID: getpid())
        #expect(items.map(\.account) == ["ann"])
        expectSecret(try vault.secret(service: "claims", account: "ann", claimedPID: getpid()).withUnsafeBytes { Array($0) }, equals: Array("kept".utf8))
        let granted = f.cli(["audit", "--json"]).stdoutText.split(separator: "\n")
            .filter { $0.contains("\"decision\":\"granted\"") && $0.contains("claimed requester") && $0.contains("(pid \(getpid()))") }
        #expect(granted.count == 2, "\(granted)")
    }
}
