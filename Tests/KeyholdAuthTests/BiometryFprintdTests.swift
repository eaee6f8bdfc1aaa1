// The harness itself and the domain state against the real fprintd with libfprint's
// virtual reader: what enrolment and deletion through fprintd do to the digest.
import Foundation
import Glibc
import KeyholdAuth
import KeyholdCLI
import KeyholdTestSupport
import Testing

@Suite(.serialized) struct FprintEnvironmentLifecycleTests {
    @Test func startsOnAPrivateBusAndStopsEverythingItStarted() throws {
        let realStore = try? FileManager.default.contentsOfDirectory(atPath: "/var/lib/fprint")
        let env = try FprintEnvironment.start()
        var stopped = false
        defer { if !stopped { env.stop() } }

        let pids = env.processIDs
        #expect(pids.count == 3)
        for pid in pids { #expect(FprintEnvironment.isAlive(pid), "pid \(pid)") }
        #expect(env.busAddress == "unix:path=\(env.directory)/bus.sock" || env.busAddress.hasPrefix("unix:path=\(env.directory)/bus.sock,"))
        #expect(env.directory.utf8.count < 40)
        #expect(try env.deviceName() == "Virtual device for debugging")
        #expect(try env.enrolledFingers(user: "khfp-nobody") == [])

        // restart replaces fprintd only, and the old one is gone
        let oldFprintd = try #require(env.fprintdProcessID)
        try env.restart()
        let newFprintd = try #require(env.fprintdProcessID)
        #expect(newFprintd != oldFprintd)
        #expect(!FprintEnvironment.isAlive(oldFprintd))
        #expect(try env.deviceName() == "Virtual device for debugging")

        // a touch that nobody asks a finger for gives up and is cleaned up by stop()
        let touch = try env.scan(print: "never-used", timeout: 60)
        let all = env.processIDs
        env.stop()
        stopped = true
        env.stop()  // idempotent
        for pid in all { #expect(!FprintEnvironment.isAlive(pid), "pid \(pid) still alive") }
        #expect(touch.wait(timeout: 1) == false)
        if ProcessInfo.processInfo.environment["KEYHOLD_KEEP_FPRINT_DIR"] == nil {
            #expect(!FileManager.default.fileExists(atPath: env.directory))
        }
        #expect(env.processIDs.isEmpty)
        // the machine's real print store was not touched
        #expect((try? FileManager.default.contentsOfDirectory(atPath: "/var/lib/fprint")) == realStore)
    }

    @Test func abandonedEnvironmentIsReapedAndLiveOnesAreNot() throws {
        let live = try FprintEnvironment.start()
        defer { live.stop() }
        let abandoned = try FprintEnvironment.start()
        defer { abandoned.stop() }
        // make `abandoned` look like the environment of a test process that crashed: its lock
        // on `owner` is gone (as when the kernel closes a dead process's files)
        abandoned.dropOwnerLockAsIfCrashed()
        let abandonedPIDs = abandoned.processIDs
        FprintEnvironment.reapAbandoned()
        // Another suite's start() in this namespace may be reaping it at the same moment (its
        // lock then held by that reaper, which this one skips): allow it to finish.
        func reaped() -> Bool {
            !abandonedPIDs.contains(where: FprintEnvironment.isAlive) && !FileManager.default.fileExists(atPath: abandoned.directory)
        }
        for _ in 0..<200 where !reaped() { usleep(50_000) }
        for pid in abandonedPIDs { #expect(!FprintEnvironment.isAlive(pid), "abandoned pid \(pid)") }
        #expect(!FileManager.default.fileExists(atPath: abandoned.directory))
        for pid in live.processIDs { #expect(FprintEnvironment.isAlive(pid), "live pid \(pid)") }
        #expect(try live.deviceName() == "Virtual device for debugging")
    }

    /// An abandoned environment made in another PID namespace (a suite run under `unshare
    /// --pid` beside this one) is left alone: its daemons cannot be seen or killed from here,
    /// and removing its directory would only leave them running. In its own namespace it is reaped.
    @Test func anAbandonedEnvironmentOfAnotherPIDNamespaceIsLeftAlone() throws {
        let abandoned = try FprintEnvironment.start()
        defer { abandoned.stop() }
        abandoned.dropOwnerLockAsIfCrashed()
        let mark = abandoned.directory + "/pidns"
        let mine = try String(contentsOfFile: mark, encoding: .utf8)
        #expect(mine == FprintEnvironment.pidNamespace() && mine.hasPrefix("pid:["))
        try "pid:[1]".write(toFile: mark, atomically: true, encoding: .utf8)
        FprintEnvironment.reapAbandoned()
        for pid in abandoned.processIDs { #expect(FprintEnvironment.isAlive(pid), "pid \(pid) of another namespace's environment killed") }
        #expect(FileManager.default.fileExists(atPath: abandoned.directory))
        try mine.write(toFile: mark, atomically: true, encoding: .utf8)
        let pids = abandoned.processIDs
        FprintEnvironment.reapAbandoned()
        for _ in 0..<200 where pids.contains(where: FprintEnvironment.isAlive) { usleep(50_000) }
        for pid in pids { #expect(!FprintEnvironment.isAlive(pid), "abandoned pid \(pid)") }
    }

    @Test func scopedHelperStopsOnThrow() throws {
        struct Boom: Error {}
        var seen: (pids: [Int32], dir: String)?
        #expect(throws: Boom.self) {
            try withFprintEnvironment { env in
                seen = (env.processIDs, env.directory)
                throw Boom()
            }
        }
        let s = try #require(seen)
        #expect(s.pids.count == 3)
        for pid in s.pids { #expect(!FprintEnvironment.isAlive(pid)) }
        if ProcessInfo.processInfo.environment["KEYHOLD_KEEP_FPRINT_DIR"] == nil {
            #expect(!FileManager.default.fileExists(atPath: s.dir))
        }
    }
}

@Suite(.serialized, .fprintEnvironment()) struct BiometryFprintdTests {
    let user = "khfp-domain"

    @Test func domainStateFollowsEnrolmentThroughFprintd() throws {
        let env = try #require(FprintEnvironment.current)
        let store = env.stateDirectory
        try? env.deleteAll(user: user)
        #expect(BiometryStore.domainState(user: user, stateDirectory: store) == .noneEnrolled)

        try env.enroll(user: user, finger: "right-index-finger", print: "print-khfp-a")
        #expect(FileManager.default.fileExists(atPath: "\(store)/\(user)/virtual_device/0/7"))
        let s1 = BiometryStore.domainState(user: user, stateDirectory: store)
        #expect(enrolledFingerNames(s1) == ["right-index-finger"])
        #expect(try env.enrolledFingers(user: user) == ["right-index-finger"])
        let d1 = try #require(biometryDigest(s1))
        // reading twice gives the same answer
        #expect(BiometryStore.domainState(user: user, stateDirectory: store) == s1)

        try env.enroll(user: user, finger: "left-thumb", print: "print-khfp-b")
        let s2 = BiometryStore.domainState(user: user, stateDirectory: store)
        #expect(enrolledFingerNames(s2) == ["left-thumb", "right-index-finger"])
        let d2 = try #require(biometryDigest(s2))
        #expect(d2 != d1)

        try env.deleteFinger(user: user, finger: "left-thumb")
        let s3 = BiometryStore.domainState(user: user, stateDirectory: store)
        #expect(s3 == .enrolled(fingers: ["right-index-finger"], digest: d1))

        try env.deleteAll(user: user)
        #expect(BiometryStore.domainState(user: user, stateDirectory: store) == .noneEnrolled)
        #expect(try env.enrolledFingers(user: user) == [])

        // the same finger enrolled again with another template: fprintd's list of names is
        // unchanged, the digest is not (this is why the digest reads the files)
        try env.enroll(user: user, finger: "right-index-finger", print: "print-khfp-c")
        let s4 = BiometryStore.domainState(user: user, stateDirectory: store)
        #expect(enrolledFingerNames(s4) == ["right-index-finger"])
        #expect(try env.enrolledFingers(user: user) == ["right-index-finger"])
        let d4 = try #require(biometryDigest(s4))
        #expect(d4 != d1 && d4 != d2)
        try env.deleteAll(user: user)
    }

    @Test func readerThroughFprintdsDBusAPI() throws {
        let env = try #require(FprintEnvironment.current)
        #expect(BiometryReader.readerDescription(busAddress: env.busAddress) == "Virtual device for debugging")
        // a bus without fprintd on it: nil, not a hang
        try env.stopFprintd()
        #expect(BiometryReader.readerDescription(busAddress: env.busAddress) == nil)
        try env.restart()
        #expect(BiometryReader.readerDescription(busAddress: env.busAddress) == "Virtual device for debugging")
    }

    @Test(.enabled(if: getuid() == 0, "needs root to drop file access to nobody"))
    func fprintdStoreIsUnreadableWithoutRoot() throws {
        let env = try #require(FprintEnvironment.current)
        try env.enroll(user: user, finger: "right-index-finger", print: "print-khfp-a")
        defer { try? env.deleteAll(user: user) }
        #expect(enrolledFingerNames(BiometryStore.domainState(user: user, stateDirectory: env.stateDirectory)) == ["right-index-finger"])
        // fprintd made the user's directory 0700 root: a non-root broker must fail closed
        let asNobody = asNobodyForFileAccess { BiometryStore.domainState(user: user, stateDirectory: env.stateDirectory) }
        #expect(asNobody == .unreadable)
    }
}
