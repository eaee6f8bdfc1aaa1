import Foundation
import KeyholdCore
import Testing
@testable import KeyholdAuth

/// The *production* stacks in `pam/` with the real pam_unix, against a throwaway account.
/// Opt-in (`KH_PAM_REAL_ACCOUNTS=1`, root): it runs useradd/chpasswd/userdel, which the normal
/// suite must never do to the machine it runs on.
@Suite(.serialized, .enabled(if: ProcessInfo.processInfo.environment["KH_PAM_REAL_ACCOUNTS"] == "1" && getuid() == 0))
struct PAMSystemStackTests {
    static func run(_ exe: String, _ args: [String], input: String? = nil) throws -> Int32 {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: exe)
        p.arguments = args
        let inPipe = Pipe()
        p.standardInput = inPipe
        p.standardOutput = FileHandle.nullDevice
        p.standardError = FileHandle.nullDevice
        try p.run()
        if let input { inPipe.fileHandleForWriting.write(Data(input.utf8)) }
        try inPipe.fileHandleForWriting.close()
        p.waitUntilExit()
        return p.terminationStatus
    }

    @Test func productionStacksWithRealPamUnix() throws {
        let user = "khci\(getpid() % 100000)"
        let password = "Pw-\(UInt32.random(in: 0...UInt32.max))"
        #expect(try Self.run("/usr/sbin/useradd", ["-M", "-s", "/usr/sbin/nologin", user]) == 0)
        defer { _ = try? Self.run("/usr/sbin/userdel", [user]) }
        #expect(try Self.run("/usr/sbin/chpasswd", [], input: "\(user):\(password)\n") == 0)

        let auth = PAMAuthenticator(helperExecutable: PAMFixture.helper,
                                    serviceDirectory: PAMFixture.repoRoot.appendingPathComponent("pam").path)
        func attempt(_ service: String, _ answer: String) -> PAMResult {
            auth.authenticate(PAMRequest(service: service, user: user, ruser: user), allowInteraction: true,
                              interruptFD: nil) { m in m.isPrompt ? .answer(PAMFixture.secret(answer)) : .answer(SecureBytes(count: 0)) }
        }
        #expect(attempt("keyhold-passcode", password) == .success(answeredPrompt: true))
        #expect(attempt("keyhold-passcode", "wrong") == .failed(code: 7))
        #expect(attempt("keyhold-passcode", "") == .failed(code: 7))
        // No reachable fprintd here: `keyhold` falls through to the password, biometry is unavailable.
        let oldBus = getenv("DBUS_SYSTEM_BUS_ADDRESS").map { String(cString: $0) }
        if oldBus == nil {
            #expect(attempt("keyhold", password) == .success(answeredPrompt: true))
            #expect(attempt("keyhold-biometry", password) == .unavailable(code: 9))
        }
    }
}
