import Foundation
import KeyholdCore
import Testing
@testable import KeyholdAuth

/// 1,000 transactions must leave the process's open fds exactly as they were and its RSS
/// roughly flat. Other suites run in parallel in the test process and open fds of their own,
/// so the loop runs in a child copy of this test binary where it is the only test
/// (`PAMLeakProbe`, enabled only there).
@Suite struct PAMLeakTests {
    @Test func thousandTransactionsLeaveFDsAndMemoryFlat() throws {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: CommandLine.arguments[0])
        p.arguments = ["--testing-library", "swift-testing", "--filter", "PAMLeakProbe"]
        var env = ProcessInfo.processInfo.environment
        env["KH_PAM_LEAK_PROBE"] = "1"
        p.environment = env
        let out = Pipe()
        p.standardOutput = out
        p.standardError = out
        try p.run()
        let data = out.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        let text = String(decoding: data, as: UTF8.self)
        let report = text.split(separator: "\n").filter { $0.contains("pam-leak:") }
        for line in report { print(line) }
        #expect(p.terminationStatus == 0)
        #expect(report.count == 1)
        #expect(text.contains("Test run with 1 test"))
    }
}

@Suite(.enabled(if: ProcessInfo.processInfo.environment["KH_PAM_LEAK_PROBE"] == "1"))
struct PAMLeakProbe {
    @Test func loop() {
        let auth = PAMFixture.authenticator()
        let request = PAMRequest(service: "keyhold-passcode", user: "alice", ruser: "alice", tty: "/dev/pts/0")
        var tally: [String: Int] = [:]
        func once(_ i: Int) {
            let r: PAMResult
            switch i % 10 {
            case 0: r = auth.authenticate(request, allowInteraction: true, interruptFD: nil) { _ in .cancel }
            case 1: r = auth.authenticate(request, allowInteraction: false, interruptFD: nil) { _ in .cancel }
            case 2, 3, 4, 5: r = auth.authenticate(request, allowInteraction: true, interruptFD: nil) { _ in .answer(PAMFixture.secret("wrong")) }
            default: r = auth.authenticate(request, allowInteraction: true, interruptFD: nil) { _ in .answer(PAMFixture.secret("s3cret")) }
            }
            tally["\(r)", default: 0] += 1
        }
        for i in 0..<50 { once(i) }  // warm caches (dyld, Swift metadata, malloc arenas)
        tally = [:]
        let fdsBefore = PAMFixture.openFDCount(), rssBefore = PAMFixture.rssKiB()
        for i in 0..<1000 { once(i) }
        let fdsAfter = PAMFixture.openFDCount(), rssAfter = PAMFixture.rssKiB()
        print("pam-leak: 1000 transactions \(tally.sorted { $0.key < $1.key }) fds \(fdsBefore) -> \(fdsAfter), RSS \(rssBefore) KiB -> \(rssAfter) KiB")
        #expect(fdsAfter == fdsBefore)
        #expect(rssAfter - rssBefore < 8 * 1024)
        #expect(tally["success(answeredPrompt: true)"] == 400)
        #expect(tally["failed(code: 7)"] == 400)
        #expect(tally["canceled"] == 100)
        #expect(tally["interactionNeeded"] == 100)
    }
}
