// The real pam_fprintd.so through the real libpam, in-process (pam_start_confdir with a
// service file in a temp dir), against the private fprintd: proves the harness the broker's
// fingerprint tests build on. Return codes are the ones the recipe saw with pamtester.
import CPAM
import Foundation
import Synchronization
import Glibc
import KeyholdAuth
import KeyholdTestSupport
import Testing

/// What the conversation saw. pam_fprintd only ever sends TEXT_INFO / ERROR_MSG.
final class FingerConversationLog: @unchecked Sendable {
    private let lock = NSLock()
    private var lines: [String] = []
    private var promptCount = 0
    func add(_ s: String) { lock.withLock { lines.append(s) } }
    func prompted() { lock.withLock { promptCount += 1 } }
    var messages: [String] { lock.withLock { lines } }
    var prompts: Int { lock.withLock { promptCount } }
}

/// A conversation that records messages and refuses prompts (a finger needs none).
private let fingerConversation: @convention(c) (
    Int32, UnsafeMutablePointer<UnsafePointer<pam_message>?>?,
    UnsafeMutablePointer<UnsafeMutablePointer<pam_response>?>?, UnsafeMutableRawPointer?
) -> Int32 = { count, messages, responses, context in
    guard count > 0, let messages, let context else { return PAM_CONV_ERR }
    let log = Unmanaged<FingerConversationLog>.fromOpaque(context).takeUnretainedValue()
    var prompted = false
    for i in 0..<Int(count) {
        guard let m = messages[i] else { continue }
        let text = m.pointee.msg.map { String(cString: $0) } ?? ""
        switch m.pointee.msg_style {
        case PAM_PROMPT_ECHO_OFF, PAM_PROMPT_ECHO_ON: prompted = true; log.prompted()
        default: log.add(text)
        }
    }
    if prompted { return PAM_CONV_ERR }
    // Some modules pass a NULL response pointer for pure messages.
    guard let responses else { return PAM_SUCCESS }
    guard let array = calloc(Int(count), MemoryLayout<pam_response>.stride) else { return PAM_BUF_ERR }
    responses.pointee = array.assumingMemoryBound(to: pam_response.self)
    return PAM_SUCCESS
}

/// DBUS_SYSTEM_BUS_ADDRESS is process-wide and pam_fprintd reads it at each call; this lock
/// keeps two callers in this process from pointing it at different buses at once.
private let busAddressLock = NSLock()

/// One pam_authenticate of `user` against the `keyhold-fp-test` service in `confdir`,
/// with pam_fprintd talking to `env`'s bus.
func fingerprintAuthenticate(user: String, confdir: String, env: FprintEnvironment)
    -> (rc: Int32, log: FingerConversationLog) {
    let log = FingerConversationLog()
    let rc: Int32 = busAddressLock.withLock {
        let previous = getenv("DBUS_SYSTEM_BUS_ADDRESS").map { String(cString: $0) }
        setenv("DBUS_SYSTEM_BUS_ADDRESS", env.busAddress, 1)
        defer {
            if let previous { setenv("DBUS_SYSTEM_BUS_ADDRESS", previous, 1) } else { unsetenv("DBUS_SYSTEM_BUS_ADDRESS") }
        }
        let context = Unmanaged.passRetained(log)
        defer { context.release() }
        var conv = pam_conv(conv: fingerConversation, appdata_ptr: context.toOpaque())
        var handle: OpaquePointer?
        let started = pam_start_confdir("keyhold-fp-test", user, &conv, confdir, &handle)
        guard started == PAM_SUCCESS, let handle else { return -started }
        let rc = pam_authenticate(handle, 0)
        pam_end(handle, rc)
        return rc
    }
    return (rc, log)
}

@Suite(.serialized, .fprintEnvironment()) struct BiometryPAMTests {
    static let user = "khfp-pam"
    static let enrolledPrint = "print-khfp-pam"

    /// A temp dir with the service file; pam_fprintd by absolute path, one try, the shortest
    /// timeout this build allows (tests never wait for it: they scan or make the reader fail).
    final class ServiceDir {
        let path: String
        init() throws {
            var t = Array("/tmp/khpam-XXXXXX".utf8CString)
            guard let p = t.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }) else { throw POSIXError(.EIO) }
            path = String(cString: p)
            try "auth required pam_fprintd.so max-tries=1 timeout=10\n"
                .write(toFile: path + "/keyhold-fp-test", atomically: false, encoding: .utf8)
        }
        deinit { try? FileManager.default.removeItem(atPath: path) }
    }

    func enrolledEnvironment() throws -> FprintEnvironment {
        let env = try #require(FprintEnvironment.current)
        if case .enrolled = BiometryStore.domainState(user: Self.user, stateDirectory: env.stateDirectory) { return env }
        try env.enroll(user: Self.user, finger: "right-index-finger", print: Self.enrolledPrint)
        return env
    }

    @Test func enrolledPrintScannedSucceeds() throws {
        let env = try enrolledEnvironment()
        let dir = try ServiceDir()
        let touch = try env.scan(print: Self.enrolledPrint)
        let (rc, log) = fingerprintAuthenticate(user: Self.user, confdir: dir.path, env: env)
        #expect(touch.wait())
        #expect(rc == PAM_SUCCESS, "\(log.messages)")
        #expect(log.messages.contains { $0.contains("right index finger") }, "\(log.messages)")
        #expect(log.prompts == 0)
    }

    @Test func otherPrintExhaustsTries() throws {
        let env = try enrolledEnvironment()
        let dir = try ServiceDir()
        let touch = try env.scan(print: "print-someone-else")
        let (rc, log) = fingerprintAuthenticate(user: Self.user, confdir: dir.path, env: env)
        #expect(touch.wait())
        #expect(rc == PAM_MAXTRIES, "\(log.messages)")
        #expect(log.messages.contains { $0.contains("Failed to match") }, "\(log.messages)")
    }

    @Test func readerErrorIsUnavailable() throws {
        let env = try enrolledEnvironment()
        let dir = try ServiceDir()
        let touch = try env.reportError()
        let (rc, log) = fingerprintAuthenticate(user: Self.user, confdir: dir.path, env: env)
        #expect(touch.wait())
        #expect(rc == PAM_AUTHINFO_UNAVAIL, "\(log.messages)")
    }

    @Test func userWithoutPrintsIsUnavailable() throws {
        let env = try #require(FprintEnvironment.current)
        let dir = try ServiceDir()
        let ghost = "khfp-no-prints"
        #expect(BiometryStore.domainState(user: ghost, stateDirectory: env.stateDirectory) == .noneEnrolled)
        let (rc, log) = fingerprintAuthenticate(user: ghost, confdir: dir.path, env: env)
        #expect(rc == PAM_AUTHINFO_UNAVAIL, "\(log.messages)")
        // nobody asked the reader for a finger
        #expect(!env.waitUntilFingerNeeded(timeout: 0.2))
    }

    @Test func restartedFprintdStillVerifies() throws {
        let env = try enrolledEnvironment()
        try env.restart()
        let dir = try ServiceDir()
        let touch = try env.scan(print: Self.enrolledPrint)
        let (rc, log) = fingerprintAuthenticate(user: Self.user, confdir: dir.path, env: env)
        #expect(touch.wait())
        #expect(rc == PAM_SUCCESS, "\(log.messages)")
    }

    @Test func waitUntilFingerNeededSeesAVerify() throws {
        let env = try enrolledEnvironment()
        let dir = try ServiceDir()
        // The verify runs on a thread of its own (not a Task: the cooperative pool is as wide as
        // the cores, and on a loaded 2-core machine other tests' blocking work can keep a task
        // from starting for longer than the wait); this one waits for the reader to ask, then scans.
        let confdir = dir.path
        let result = Mutex<Int32?>(nil)
        let done = DispatchSemaphore(value: 0)
        let verify = Thread {
            let rc = fingerprintAuthenticate(user: Self.user, confdir: confdir, env: env).rc
            result.withLock { $0 = rc }
            done.signal()
        }
        verify.start()
        #expect(env.waitUntilFingerNeeded(timeout: 15))
        let touch = try env.scan(print: Self.enrolledPrint)
        #expect(touch.wait())
        done.wait()
        #expect(result.withLock { $0 } == PAM_SUCCESS)
    }
}

/// The storage variant of the virtual reader identifies any enrolled finger (the plain one
/// verifies only the first), for tests that need two working fingers.
@Suite(.serialized, .fprintEnvironment(.virtualDeviceStorage)) struct BiometryStorageReaderPAMTests {
    static let user = "khfp-storage"

    @Test func everyEnrolledFingerMatchesAndOthersDoNot() throws {
        let env = try #require(FprintEnvironment.current)
        try env.enroll(user: Self.user, finger: "right-index-finger", print: "print-st-a")
        try env.enroll(user: Self.user, finger: "left-thumb", print: "print-st-b")
        let state = BiometryStore.domainState(user: Self.user, stateDirectory: env.stateDirectory)
        #expect(enrolledFingerNames(state) == ["left-thumb", "right-index-finger"])
        let dir = try BiometryPAMTests.ServiceDir()
        for (print, expected) in [("print-st-a", PAM_SUCCESS), ("print-st-b", PAM_SUCCESS), ("print-st-z", PAM_MAXTRIES)] {
            let touch = try env.scan(print: print)
            let (rc, log) = fingerprintAuthenticate(user: Self.user, confdir: dir.path, env: env)
            #expect(touch.wait())
            #expect(rc == expected, "\(print): \(log.messages)")
        }
        // the storage reader forgets its prints on restart; the harness gives them back
        try env.restart()
        let touch = try env.scan(print: "print-st-b")
        let (rc, log) = fingerprintAuthenticate(user: Self.user, confdir: dir.path, env: env)
        #expect(touch.wait())
        #expect(rc == PAM_SUCCESS, "after restart: \(rc) \(log.messages)")
    }
}
