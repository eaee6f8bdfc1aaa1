import Foundation
import Testing
@testable import KeyholdAuth
import KeyholdTestSupport
import CKeyholdOS

/// Caller facts read from the real /proc of real processes started by the test.
@Suite struct CallerFactsTests {
    /// A process started with posix_spawn (optionally in a new session) and killed and reaped
    /// when the test is done. Foundation's Process is not used: it cannot start a session.
    final class Child {
        let pid: pid_t
        init(_ exe: String, _ args: [String], environment: [String]? = nil, newSession: Bool = false) throws {
            var attr = posix_spawnattr_t()
            posix_spawnattr_init(&attr)
            defer { posix_spawnattr_destroy(&attr) }
            if newSession { posix_spawnattr_setflags(&attr, 0x80) }  // POSIX_SPAWN_SETSID (glibc ≥ 2.26)
            var actions = posix_spawn_file_actions_t()
            posix_spawn_file_actions_init(&actions)
            defer { posix_spawn_file_actions_destroy(&actions) }
            for fd: Int32 in 0...2 { posix_spawn_file_actions_addopen(&actions, fd, "/dev/null", O_RDWR, 0) }
            // Nothing else of the test process (another test's descriptors) goes to the child.
            _ = ckh_spawn_closefrom(&actions, 3)
            let argv: [UnsafeMutablePointer<CChar>?] = ([exe] + args).map { strdup($0) } + [nil]
            let envp: [UnsafeMutablePointer<CChar>?]? = environment.map { $0.map { strdup($0) } + [nil] }
            defer { argv.forEach { free($0) }; envp?.forEach { free($0) } }
            var pid: pid_t = 0
            let rc = envp.map { e in posix_spawn(&pid, exe, &actions, &attr, argv, e) }
                ?? posix_spawn(&pid, exe, &actions, &attr, argv, environ)
            guard rc == 0 else { throw POSIXError(POSIXErrorCode(rawValue: rc) ?? .EINVAL) }
            self.pid = pid
        }
        func stop() {
            kill(pid, SIGKILL)
            var status: Int32 = 0
            while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
        }
    }

    /// Waits (bounded, not timed-asserted) for a `sleep` process at or below `root` whose
    /// cmdline has `marker`.
    static func sleeper(under root: Int32, marker: String) -> Int32? {
        for _ in 0..<1500 {
            for pid in PAMFixture.processes(containing: marker) {
                guard let comm = try? String(contentsOfFile: "/proc/\(pid)/comm", encoding: .utf8),
                      comm == "sleep\n" else { continue }
                var p = pid
                for _ in 0..<8 {
                    if p == root { return pid }
                    guard let s = ProcStat.read(pid: p) else { break }
                    p = s.ppid
                }
            }
            usleep(10_000)
        }
        return nil
    }

    @Test func ownProcessGivesOwnExecutableAndSession() throws {
        let facts = try #require(CallerFacts.read(pid: getpid()))
        #expect(facts.executable == (try FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")))
        #expect(facts.sessionID == getsid(0))
        #expect(facts.parentPID == getppid())
        let fd = open("/dev/tty", O_RDONLY | O_NOCTTY)
        if fd >= 0 { close(fd); #expect(facts.tty?.hasPrefix("/dev/") == true) } else { #expect(facts.tty == nil) }
        // The same process read twice is the same process (start time is stable).
        #expect(CallerFacts.read(pid: getpid())?.startTime == facts.startTime)
    }

    @Test func childInItsOwnSessionHasNoTerminal() throws {
        let child = try Child("/bin/sleep", ["61.\(getpid())"], newSession: true)
        defer { child.stop() }
        let sleeper = try #require(Self.sleeper(under: child.pid, marker: "sleep 61.\(getpid())"))
        #expect(sleeper == child.pid)
        let facts = try #require(CallerFacts.read(pid: sleeper))
        #expect(facts.sessionID == sleeper)  // setsid made it a session leader
        #expect(facts.tty == nil)
        #expect(facts.executable?.hasSuffix("sleep") == true)
        #expect(facts.remote == nil)
    }

    @Test func childOnAPseudoTerminalReportsIt() throws {
        // script(1) runs its command on a new pty; compare with the fd the kernel gave it.
        let marker = "62.\(getpid())"
        let child = try Child("/usr/bin/script", ["-qfc", "exec /bin/sleep \(marker)", "/dev/null"])
        defer { child.stop(); for p in PAMFixture.processes(containing: "sleep \(marker)") { kill(p, SIGKILL) } }
        let sleeper = try #require(Self.sleeper(under: child.pid, marker: "sleep \(marker)"))
        let facts = try #require(CallerFacts.read(pid: sleeper))
        let stdinPath = try FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(sleeper)/fd/0")
        #expect(facts.tty == stdinPath)
        #expect(facts.tty?.hasPrefix("/dev/pts/") == true)
    }

    @Test func descendantOfSSHDIsRemoteWithTheClientAddress() throws {
        // A copy of /bin/sh named sshd stands in for the session's sshd: the walk goes by the
        // ancestor's executable name (which can only make a caller look *more* restricted).
        let dir = PAMFixture.tempDirectory()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        try copyProgram(URL(fileURLWithPath: "/bin/sh").resolvingSymlinksInPath().path, to: dir + "/sshd")
        for (value, expected) in [("203.0.113.9 52811 10.0.0.1 22", "203.0.113.9"),
                                  ("2001:db8::7 52811 2001:db8::1 22", "2001:db8::7"),
                                  ("\u{1b}[31mevil 1 2 3", "remote")] {
            let marker = "63.\(getpid())\(expected.count)"
            let child = try Child(dir + "/sshd", ["-c", "/bin/sleep \(marker); :"],
                                  environment: ["SSH_CONNECTION=" + value, "PATH=/usr/bin:/bin"])
            defer { child.stop(); for p in PAMFixture.processes(containing: "sleep \(marker)") { kill(p, SIGKILL) } }
            let sleeper = try #require(Self.sleeper(under: child.pid, marker: "sleep \(marker)"))
            let facts = try #require(CallerFacts.read(pid: sleeper))
            #expect(facts.remote == CallerFacts.RemoteSession(sshdPID: child.pid, host: expected))
            #expect(facts.pamRemoteHost == expected)
        }
    }

    /// Long executable paths (around 1 KiB: beyond what a small buffer would hold) are named
    /// whole, never cut short, never nil.
    @Test func executablePathsAroundTheFirstBufferAreReadWhole() throws {
        let dir = PAMFixture.tempDirectory()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let sleep = URL(fileURLWithPath: "/bin/sleep").resolvingSymlinksInPath().path
        let first = 1024
        for length in [first - 1, first, first + 1] {
            // Directories of 200-byte names, then a file name that makes the path `length` long.
            var path = dir + "/\(length)"
            while length - path.count > 255 { path += "/" + String(repeating: "d", count: 200) }
            try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
            path += "/" + String(repeating: "x", count: length - path.count - 1)
            #expect(path.utf8.count == length)
            try copyProgram(sleep, to: path)
            let child = try Child(path, ["64.\(getpid())"])
            defer { child.stop() }
            // posix_spawn returns once the child has exec'd: the link names the copy now.
            #expect(CallerFacts.readExecutable(pid: child.pid) == path)
            #expect(CallerFacts.readLocal(pid: child.pid)?.executable == path)
        }
        // Gone: nothing, whichever buffer.
        #expect(CallerFacts.readExecutable(pid: Int32.max) == nil)
    }

    @Test func goneOrInvalidPidsGiveNothing() {
        #expect(CallerFacts.read(pid: 0) == nil)
        #expect(CallerFacts.read(pid: -1) == nil)
        #expect(CallerFacts.read(pid: Int32.max) == nil)
    }

    @Test func statParserCountsFieldsAfterTheLastParenthesis() {
        let tail = " 0 0 0 0 0 0 0 0 0 0 0 0 123456 0 0\n"
        let hostile = Array("4242 (a) S 1 2 3 34817 (x) R 9 9 9 9 9) S 77 4242 4242 34817 -1 4194560".utf8) + Array(tail.utf8)
        let s = ProcStat.parse(hostile, pid: 4242)
        #expect(s == ProcStat(pid: 4242, state: UInt8(ascii: "S"), ppid: 77, pgrp: 4242, session: 4242, ttyNr: 34817, startTime: 123456))
        for bad in ["", "4242 no parens S 1", "1 (x) S", "1 (x) SS 1 1 1 0" + tail, "1 (x) S a b c d" + tail] {
            #expect(ProcStat.parse(Array(bad.utf8), pid: 1) == nil)
        }
    }

    /// The in-place parser against a plain split of the same line, for the stat line of every
    /// thread on this machine, and at the edges of its number rules.
    @Test func statParserAgreesWithASplitOfEveryLiveStatLine() throws {
        func reference(_ bytes: [UInt8], pid: Int32) -> ProcStat? {
            guard let close = bytes.lastIndex(of: UInt8(ascii: ")")) else { return nil }
            let rest = bytes[(close + 1)...].split(separator: UInt8(ascii: " ")).map { String(decoding: $0, as: UTF8.self) }
            guard rest.count >= 20, rest[0].utf8.count == 1, let ppid = Int32(rest[1]), let pgrp = Int32(rest[2]),
                  let session = Int32(rest[3]), let tty = Int32(rest[4]),
                  let start = UInt64(rest[19].prefix(while: { $0 != "\n" })) else { return nil }
            return ProcStat(pid: pid, state: rest[0].utf8.first!, ppid: ppid, pgrp: pgrp, session: session, ttyNr: tty, startTime: start)
        }
        var lines = 0
        for pid in ProcFile.pids() {
            guard let dir = opendir("/proc/\(pid)/task") else { continue }
            defer { closedir(dir) }
            while let e = readdir(dir) {
                let name = withUnsafeBytes(of: e.pointee.d_name) { String(decoding: $0.prefix(while: { $0 != 0 }), as: UTF8.self) }
                guard let tid = Int32(name), let bytes = ProcFile.read("/proc/\(pid)/task/\(tid)/stat", limit: 4096) else { continue }
                let parsed = ProcStat.parse(bytes, pid: tid)
                #expect(parsed != nil && parsed == reference(bytes, pid: tid), "\(String(decoding: bytes, as: UTF8.self))")
                lines += 1
            }
        }
        #expect(lines > 10)
        let tail = " 0 0 0 0 0 0 0 0 0 0 0 0 123456 0 0\n"
        let edges = ["1 (a) S 1 2 3 -1" + tail, "1 (a) S 2147483647 2 3 0" + tail, "1 (a) S 2147483648 2 3 0" + tail,
                     "1 (a) S -2147483648 2 3 0" + tail, "1 (a) S 1 2 3 --1" + tail, "1 (a) S 1 2 3 -" + tail,
                     "1 (a) S 1  2   3 0" + tail, "1 (a) S 1 2 3 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 7\n",
                     "1 (a) S 1 2 3 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0", "1 (a) S 1 2 3 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 1x 5"]
        for line in edges {
            #expect(ProcStat.parse(Array(line.utf8), pid: 1) == reference(Array(line.utf8), pid: 1), "\(line)")
        }
    }

    @Test func terminalNumbersDecode() {
        #expect(CallerFacts.ttyPath(0) == nil)
        #expect(CallerFacts.ttyPath(136 << 8) == "/dev/pts/0")
        #expect(CallerFacts.ttyPath(137 << 8 | 44) == "/dev/pts/300")
        #expect(CallerFacts.ttyPath(Int32(136 << 8 | 0x10 | (0x1 << 20))) == "/dev/pts/272")
        #expect(CallerFacts.ttyPath(4 << 8 | 1) == "/dev/tty1")
        #expect(CallerFacts.ttyPath(4 << 8 | 65) == "/dev/ttyS1")
        #expect(CallerFacts.ttyPath(5 << 8) == nil)
    }

    @Test func accountFromUid() {
        let root = CallerAccount.lookup(uid: 0)
        #expect(root?.name == "root")
        #expect(root?.home == "/root")
        #expect(CallerAccount.lookup(uid: 3_999_999_999) == nil)
    }
}
