// BiometryStore over hand-made print trees in temp dirs: finger names, digest framing,
// hostile user names and entries fprintd never writes. No fprintd needed here.
import Foundation
import Glibc
import KeyholdAuth
import Testing

/// A temp directory removed when the test ends.
final class BiometryTempTree {
    let path: String
    init() throws {
        var t = Array("/tmp/khbs-XXXXXX".utf8CString)
        guard let p = t.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }) else {
            throw POSIXError(.EIO)
        }
        path = String(cString: p)
    }
    deinit { try? FileManager.default.removeItem(atPath: path) }

    /// Writes `bytes` at `relative`, creating parent directories (0700, as fprintd does).
    func write(_ relative: String, _ bytes: [UInt8]) throws {
        let full = path + "/" + relative
        let parent = (full as NSString).deletingLastPathComponent
        try FileManager.default.createDirectory(atPath: parent, withIntermediateDirectories: true,
                                                attributes: [.posixPermissions: 0o700])
        #expect(FileManager.default.createFile(atPath: full, contents: Data(bytes)))
    }
    func write(_ relative: String, _ text: String) throws { try write(relative, Array(text.utf8)) }
    func mkdir(_ relative: String) throws {
        try FileManager.default.createDirectory(atPath: path + "/" + relative, withIntermediateDirectories: true)
    }
    func remove(_ relative: String) throws { try FileManager.default.removeItem(atPath: path + "/" + relative) }
}

/// Runs `body` with this thread's filesystem uid set to nobody, so root's DAC override is
/// gone for file access on this thread only (fsuid is per thread; glibc does not broadcast
/// setfsuid). `body` must not suspend. setfsuid is looked up at run time: Glibc's module
/// does not export <sys/fsuid.h>.
func asNobodyForFileAccess<R>(_ body: () -> R) -> R {
    typealias SetFSUID = @convention(c) (UInt32) -> Int32
    guard getuid() == 0, let sym = dlsym(nil, "setfsuid") else { return body() }
    let setfsuid = unsafeBitCast(sym, to: SetFSUID.self)
    _ = setfsuid(65534)
    defer { _ = setfsuid(0) }
    return body()
}

func biometryDigest(_ state: BiometryDomainState) -> BiometryDigest? {
    if case .enrolled(_, let d) = state { return d }
    return nil
}

func enrolledFingerNames(_ state: BiometryDomainState) -> [String]? {
    if case .enrolled(let f, _) = state { return f }
    return nil
}

@Suite struct BiometryStoreTests {
    @Test func missingStateDirectoryIsUnreadable() throws {
        let t = try BiometryTempTree()
        #expect(BiometryStore.domainState(user: "alice", stateDirectory: t.path + "/nope") == .unreadable)
        try t.write("file", "x")
        #expect(BiometryStore.domainState(user: "alice", stateDirectory: t.path + "/file") == .unreadable)
    }

    @Test func noUserDirectoryOrNoPrintFilesIsNoneEnrolled() throws {
        let t = try BiometryTempTree()
        #expect(BiometryStore.domainState(user: "alice", stateDirectory: t.path) == .noneEnrolled)
        try t.mkdir("alice/virtual_device/0")
        #expect(BiometryStore.domainState(user: "alice", stateDirectory: t.path) == .noneEnrolled)
        // a file whose name is no finger is no enrolled finger
        try t.write("alice/virtual_device/0/notes", "x")
        #expect(BiometryStore.domainState(user: "alice", stateDirectory: t.path) == .noneEnrolled)
    }

    @Test func fingerNamesFollowLibfprintNumbering() throws {
        let t = try BiometryTempTree()
        for (i, c) in "a987654321".enumerated() { try t.write("u/virtual_device/0/\(c)", "print-\(i)") }
        try t.write("u/other_driver/3/7", "same finger on another device")
        let state = BiometryStore.domainState(user: "u", stateDirectory: t.path)
        #expect(enrolledFingerNames(state) == [
            "left-thumb", "left-index-finger", "left-middle-finger", "left-ring-finger", "left-little-finger",
            "right-thumb", "right-index-finger", "right-middle-finger", "right-ring-finger", "right-little-finger",
        ])
        #expect(BiometryStore.fingerName(forFileName: "7") == "right-index-finger")
        #expect(BiometryStore.fingerName(forFileName: "1") == "left-thumb")
        #expect(BiometryStore.fingerName(forFileName: "a") == "right-little-finger")
        for bad in ["0", "b", "A", "10", "07", "", "7 ", "x"] { #expect(BiometryStore.fingerName(forFileName: bad) == nil) }
    }

    @Test func digestCoversPathsLengthsAndContents() throws {
        func state(_ files: [(String, String)]) throws -> BiometryDigest? {
            let t = try BiometryTempTree()
            for (p, c) in files { try t.write("u/" + p, c) }
            return biometryDigest(BiometryStore.domainState(user: "u", stateDirectory: t.path))
        }
        let base = try #require(try state([("virtual_device/0/7", "print-A"), ("virtual_device/0/1", "print-B")]))
        #expect(base.bytes.count == 32)
        // same tree written in another order: same digest
        #expect(try state([("virtual_device/0/1", "print-B"), ("virtual_device/0/7", "print-A")]) == base)
        // one byte of one template changed (a re-enrolment of the same finger)
        #expect(try state([("virtual_device/0/7", "print-a"), ("virtual_device/0/1", "print-B")]) != base)
        // a finger removed, a finger added, a file renamed, a device moved
        #expect(try state([("virtual_device/0/7", "print-A")]) != base)
        #expect(try state([("virtual_device/0/7", "print-A"), ("virtual_device/0/1", "print-B"), ("virtual_device/0/2", "")]) != base)
        #expect(try state([("virtual_device/0/7", "print-A"), ("virtual_device/0/6", "print-B")]) != base)
        #expect(try state([("virtual_device/0/7", "print-A"), ("virtual_device/1/1", "print-B")]) != base)
        // bytes shifted from one file to the next must not collide (lengths are framed)
        let x = try state([("d/0/1", "ab"), ("d/0/7", "c")])
        let y = try state([("d/0/1", "a"), ("d/0/7", "bc")])
        #expect(x != nil && y != nil && x != y)
        // a stray non-finger file still counts in the digest
        #expect(try state([("virtual_device/0/7", "print-A"), ("virtual_device/0/1", "print-B"), ("virtual_device/0/tmp", "")]) != base)
    }

    @Test func hostileUserNamesCannotLeaveTheStore() throws {
        let t = try BiometryTempTree()
        try t.write("state/alice/virtual_device/0/7", "alice")
        try t.write("outside/virtual_device/0/7", "not a user of this store")
        try t.write("state/virtual_device/0/7", "planted at the store's top")
        symlink(t.path + "/outside", t.path + "/state/mallory")
        let store = t.path + "/state"
        #expect(enrolledFingerNames(BiometryStore.domainState(user: "alice", stateDirectory: store)) == ["right-index-finger"])
        for name in ["", ".", "..", "../outside", "alice/virtual_device", "alice/", "/", "/tmp", "\(t.path)/outside",
                     "alice\u{0}", "\u{0}", String(repeating: "a", count: 256), "mallory"] {
            #expect(BiometryStore.domainState(user: name, stateDirectory: store) == .unreadable, "user \(name.debugDescription)")
        }
        for name in ["", ".", "..", "a/b", "x\u{0}y", String(repeating: "a", count: 256)] {
            #expect(!BiometryStore.isAcceptableUserName(name))
        }
        for name in ["alice", "a.b-c_d", "...", "user@realm", String(repeating: "a", count: 255)] {
            #expect(BiometryStore.isAcceptableUserName(name))
        }
    }

    @Test func entriesFprintdNeverWritesFailClosed() throws {
        let t = try BiometryTempTree()
        try t.write("u/virtual_device/0/7", "print")
        #expect(enrolledFingerNames(BiometryStore.domainState(user: "u", stateDirectory: t.path)) == ["right-index-finger"])
        // a symlink to a file elsewhere
        try t.write("elsewhere", "x")
        symlink(t.path + "/elsewhere", t.path + "/u/virtual_device/0/1")
        #expect(BiometryStore.domainState(user: "u", stateDirectory: t.path) == .unreadable)
        try t.remove("u/virtual_device/0/1")
        // a symlinked directory
        symlink(t.path + "/u/virtual_device", t.path + "/u/loop")
        #expect(BiometryStore.domainState(user: "u", stateDirectory: t.path) == .unreadable)
        try t.remove("u/loop")
        // a FIFO (would block a naive reader)
        #expect(mkfifo(t.path + "/u/virtual_device/0/2", 0o600) == 0)
        #expect(BiometryStore.domainState(user: "u", stateDirectory: t.path) == .unreadable)
        try t.remove("u/virtual_device/0/2")
        // a tree deeper than fprintd ever writes
        try t.write("u/" + Array(repeating: "d", count: 12).joined(separator: "/") + "/7", "deep")
        #expect(BiometryStore.domainState(user: "u", stateDirectory: t.path) == .unreadable)
        try t.remove("u/d")
        #expect(enrolledFingerNames(BiometryStore.domainState(user: "u", stateDirectory: t.path)) == ["right-index-finger"])
    }

    @Test func permissionDeniedIsUnreadable() throws {
        let t = try BiometryTempTree()
        try t.write("u/virtual_device/0/7", "print")
        chmod(t.path, 0o755)
        chmod(t.path + "/u", 0o700)
        let readable = BiometryStore.domainState(user: "u", stateDirectory: t.path)
        #expect(enrolledFingerNames(readable) == ["right-index-finger"])
        chmod(t.path + "/u/virtual_device/0/7", 0o000)
        chmod(t.path + "/u", 0o000)
        defer { chmod(t.path + "/u", 0o700); chmod(t.path + "/u/virtual_device/0/7", 0o600) }
        // as root, DAC override would read it anyway: drop it for this thread's file access
        let state = asNobodyForFileAccess { BiometryStore.domainState(user: "u", stateDirectory: t.path) }
        #expect(state == .unreadable)
        // a user name that does not exist is still noneEnrolled to a non-root reader of a 0755 store
        let other = asNobodyForFileAccess { BiometryStore.domainState(user: "nobody-here", stateDirectory: t.path) }
        #expect(other == .noneEnrolled)
    }

    @Test func digestValueType() throws {
        #expect(BiometryDigest(bytes: Array(repeating: 1, count: 31)) == nil)
        #expect(BiometryDigest(bytes: Array(repeating: 1, count: 33)) == nil)
        let a = try #require(BiometryDigest(bytes: Array(0..<32)))
        let b = try #require(BiometryDigest(bytes: Array(0..<32)))
        var changed = Array(UInt8(0)..<32); changed[31] ^= 1
        let c = try #require(BiometryDigest(bytes: changed))
        #expect(a == b && a.constantTimeEquals(b))
        #expect(a != c && !a.constantTimeEquals(c))
        #expect(a.hex == "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f")
    }
}
