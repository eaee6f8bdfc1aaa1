import Foundation
import Glibc
import Testing
import KeyholdTestSupport

/// The pid the agent passes is a claim the broker checks: a D-Bus client running as another
/// user (let onto the bus by its policy) names a process that is not the caller's, and the
/// broker refuses the request rather than record or act on it.
@Suite(.serialized) struct SecretServiceClaimTests {
    @Test func claimedPIDOfAnotherUserIsRefused() throws {
        let guest = try TestUser(prefix: "khg")
        let f = try SecretServiceFixture(busGuests: [guest.name])
        #expect(f.secretTool(["store", "--label=x", "service", "claim", "account", "ann"], stdin: "mine").status == 0,
                "\(f.log("agent.log"))")

        let env = f.userEnvironment().map { "\($0)=\($1)" }
        let lookup = runCommand("/usr/bin/env", ["-i"] + env + ["timeout", "-s", "KILL", "60", "/usr/bin/secret-tool", "lookup", "service", "claim", "account", "ann"],
                                asUser: guest.name)
        #expect(lookup.status != 0 && !lookup.stdoutText.contains("mine"), "guest read: \(lookup.stdoutText) \(lookup.stderr)")
        // It reached the agent (not only refused by the bus): the search answered, the read did not.
        let search = runCommand("/usr/bin/env", ["-i"] + env + ["timeout", "-s", "KILL", "60", "/usr/bin/secret-tool", "search", "service", "claim"],
                                asUser: guest.name)
        #expect(!search.stdoutText.contains("mine"), "\(search.stdoutText)")

        let audit = f.cli(["audit", "--json"])
        // The refusal is audited as a denial (not-authorized) of that item; no release.
        let rows = audit.stdoutText.split(separator: "\n")
        #expect(rows.contains { $0.contains("\"account\":\"ann\"") && $0.contains("\"decision\":\"denied\"") && $0.contains("\"outcome\":\"not-authorized\"") },
                "\(audit.stdoutText)")
        #expect(!rows.contains { $0.contains("\"operation\":\"get\"") && $0.contains("\"decision\":\"granted\"") }, "\(audit.stdoutText)")
        // Recorded under the operation asked for (a read), with why: the claimed pid is another uid's.
        #expect(rows.contains { $0.contains("\"operation\":\"get\"") && $0.contains("\"decision\":\"denied\"")
                    && $0.contains("claimed requester (pid ") && $0.contains("runs as uid \(guest.uid), not as the caller") },
                "\(audit.stdoutText)")
        #expect(!rows.contains { $0.contains("\"operation\":\"invalid\"") }, "\(audit.stdoutText)")
        // The owner still reads it.
        #expect(f.secretTool(["lookup", "service", "claim", "account", "ann"]).stdoutText == "mine")
    }
}
