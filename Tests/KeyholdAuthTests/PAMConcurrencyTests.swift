import Foundation
import KeyholdCore
import Testing
@testable import KeyholdAuth

/// Each call has its own helper: a transaction stuck in a module holds up nobody else, and
/// the system PAM path (pam_start without a service directory) works the same way.
@Suite struct PAMConcurrencyTests {
    /// Results collected from plain threads (the broker calls from its own threads; Swift
    /// concurrency's pool is too small on 2 cores to host blocking calls side by side).
    final class Results: @unchecked Sendable {
        private let lock = NSLock()
        private var items: [PAMResult] = []
        func add(_ r: PAMResult) { lock.lock(); items.append(r); lock.unlock() }
        var all: [PAMResult] { lock.lock(); defer { lock.unlock() }; return items }
    }

    static func onThread(_ group: DispatchGroup, _ body: @escaping @Sendable () -> Void) {
        group.enter()
        Thread.detachNewThread { body(); group.leave() }
    }

    @Test func aHangingTransactionDoesNotHoldUpOthers() {
        let dir = PAMFixture.tempDirectory()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let marker = "989.\(getpid())"
        PAMFixture.write("auth optional pam_echo.so waiting\nauth required pam_exec.so /bin/sleep \(marker)\naccount required pam_permit.so\n",
                         to: dir + "/custom")
        var p: [Int32] = [-1, -1]
        #expect(pipe(&p) == 0)
        let (readEnd, writeEnd) = (p[0], p[1])
        defer { close(readEnd); close(writeEnd) }

        let hanging = Results(), others = Results()
        let hangingDone = DispatchGroup(), othersDone = DispatchGroup()
        Self.onThread(hangingDone) {
            hanging.add(PAMFixture.authenticator(dir).authenticate(PAMRequest(service: "custom", user: "dave"),
                        allowInteraction: true, interruptFD: readEnd) { _ in .answer(SecureBytes(count: 0)) })
        }
        // Wait until the hanging module is running (bounded poll, no timing assertion).
        for _ in 0..<1000 where PAMFixture.processes(containing: "sleep \(marker)").isEmpty { usleep(10_000) }
        #expect(!PAMFixture.processes(containing: "sleep \(marker)").isEmpty)

        for i in 0..<16 {
            Self.onThread(othersDone) {
                others.add(PAMFixture.authenticator().authenticate(PAMRequest(service: "keyhold-passcode", user: "alice"),
                           allowInteraction: true, interruptFD: nil) { _ in .answer(PAMFixture.secret(i % 2 == 0 ? "s3cret" : "wrong")) })
            }
        }
        othersDone.wait()
        #expect(others.all.filter { $0 == .success(answeredPrompt: true) }.count == 8)
        #expect(others.all.filter { $0 == .failed(code: 7) }.count == 8)
        #expect(hanging.all.isEmpty)  // still stuck in its module meanwhile

        _ = write(writeEnd, "x", 1)
        hangingDone.wait()
        #expect(hanging.all == [.canceled])
        #expect(PAMFixture.allGone("sleep \(marker)"))
    }

    @Test(.enabled(if: FileManager.default.fileExists(atPath: "/etc/pam.d/other")))
    func systemConfigurationPathStopsAtThePromptWithoutInteraction() {
        // pam_start (no confdir): an unknown service falls to /etc/pam.d/other (Debian: pam_unix,
        // which prompts even for unknown users). Without interaction nothing is answered.
        let auth = PAMAuthenticator(helperExecutable: PAMFixture.helper, serviceDirectory: nil, deadlineSeconds: 30)
        var seen: [PAMMessage] = []
        let r = auth.authenticate(PAMRequest(service: "keyhold-no-such-service", user: "kh-no-such-user"),
                                  allowInteraction: false, interruptFD: nil) { m in seen.append(m); return .cancel }
        #expect(r == .interactionNeeded || r == .failed(code: 7) || r == .failed(code: 10))
        #expect(seen.allSatisfy { !$0.isPrompt })
    }
}
