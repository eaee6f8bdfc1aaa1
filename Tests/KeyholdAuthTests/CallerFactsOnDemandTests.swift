import Foundation
import Testing
@testable import KeyholdAuth
import KeyholdTestSupport

/// The sshd walk read on demand (only PAM needs it): it finds the same remote session as the
/// full read, and a sender that has gone (or whose pid now names another process) counts as
/// remote, which only restricts it.
@Suite struct CallerFactsOnDemandTests {
    @Test func remoteOnDemandMatchesTheFullReadAndFailsClosed() throws {
        let dir = PAMFixture.tempDirectory()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        try copyProgram(URL(fileURLWithPath: "/bin/sh").resolvingSymlinksInPath().path, to: dir + "/sshd")
        let marker = "64.\(getpid())"
        let child = try CallerFactsTests.Child(dir + "/sshd", ["-c", "/bin/sleep \(marker); :"],
                                               environment: ["SSH_CONNECTION=203.0.113.9 52811 10.0.0.1 22", "PATH=/usr/bin:/bin"])
        defer { child.stop(); for p in PAMFixture.processes(containing: "sleep \(marker)") { kill(p, SIGKILL) } }
        let sleeper = try #require(CallerFactsTests.sleeper(under: child.pid, marker: "sleep \(marker)"))
        let local = try #require(CallerFacts.readLocal(pid: sleeper))
        #expect(local.remote == nil)
        #expect(local.executable?.hasSuffix("sleep") == true)
        #expect(CallerFacts.remoteSession(of: local) == CallerFacts.read(pid: sleeper)?.remote)
        #expect(CallerFacts.remoteSession(of: local)?.host == "203.0.113.9")

        // The pid now names another process (its start time differs), or no process: remote, not local.
        var reused = local
        reused.startTime += 1
        #expect(CallerFacts.remoteSession(of: reused)?.host == "remote")
        var gone = local
        gone.pid = Int32.max
        #expect(CallerFacts.remoteSession(of: gone)?.host == "remote")
    }

    @Test func aLocalProcessStaysLocalOnDemand() throws {
        let me = try #require(CallerFacts.readLocal(pid: getpid()))
        // The test runner may itself run under sshd; the on-demand walk must agree with the full read.
        #expect(CallerFacts.remoteSession(of: me) == CallerFacts.read(pid: getpid())?.remote)
    }
}
