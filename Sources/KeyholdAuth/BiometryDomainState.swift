// The Linux counterpart of LAContext.evaluatedPolicyDomainState: a digest of the fingers a
// user has enrolled with fprintd, so a `biometry-current-set` item can tell when they changed.
import CSodium
import Glibc
import KeyholdCore

/// What fprintd's store says about one user's enrolled fingers.
public enum BiometryDomainState: Sendable, Equatable {
    /// The store could not be read completely (not root, no such directory, a hostile user
    /// name, an entry fprintd never writes, a read error). Callers fail closed on this.
    case unreadable
    /// No print file for the user (fprintd removes the user's directory with the last print).
    case noneEnrolled
    /// At least one enrolled finger; `digest` covers every print file of the user.
    case enrolled(fingers: [String], digest: BiometryDigest)
}

/// 32-byte BLAKE2b digest over a user's print files. Not secret, but compared in constant
/// time anyway so that comparing it never becomes an oracle on a stored value.
public struct BiometryDigest: Sendable, Equatable, CustomStringConvertible {
    public static let byteCount = 32
    public let bytes: [UInt8]

    /// Nil unless exactly 32 bytes (a digest read back from a store record).
    public init?(bytes: [UInt8]) {
        guard bytes.count == Self.byteCount else { return nil }
        self.bytes = bytes
    }

    public func constantTimeEquals(_ other: BiometryDigest) -> Bool {
        Sodium.ready()
        guard bytes.count == other.bytes.count else { return false }
        return bytes.withUnsafeBytes { a in
            other.bytes.withUnsafeBytes { b in sodium_memcmp(a.baseAddress!, b.baseAddress!, a.count) == 0 }
        }
    }

    public static func == (lhs: BiometryDigest, rhs: BiometryDigest) -> Bool { lhs.constantTimeEquals(rhs) }

    /// Lower-case hex of all 32 bytes.
    public var hex: String { Hex.encode(bytes) }

    public var description: String { "BiometryDigest(\(hex.prefix(16))…)" }
}

/// Reads fprintd's file store: `<stateDirectory>/<user>/<driver>/<device-id>/<finger>`, where
/// `<finger>` is libfprint's FpFinger number as one hex digit (1 left-thumb … a right-little).
///
/// Why the files and not fprintd's D-Bus `ListEnrolledFingers`: the names stay the same when
/// a finger is deleted and enrolled again (a new template), but the file bytes change, and a
/// re-enrolment is exactly the change `biometry-current-set` must notice. The files are
/// readable only by root (fprintd makes each user's directory 0700 root), which the broker is.
///
/// Fallback decision: when the store cannot be read, the answer is `.unreadable` and there
/// is deliberately no fallback to the D-Bus finger list — that would silently downgrade
/// `biometry-current-set` to "same finger names". Callers fail closed on `.unreadable`.
public enum BiometryStore {
    public static let defaultStateDirectory = "/var/lib/fprint"

    /// libfprint's FpFinger names, index = enum value (0 is FP_FINGER_UNKNOWN).
    public static let fingerNames: [String] = [
        "unknown-finger",
        "left-thumb", "left-index-finger", "left-middle-finger", "left-ring-finger", "left-little-finger",
        "right-thumb", "right-index-finger", "right-middle-finger", "right-ring-finger", "right-little-finger",
    ]

    // Bounds on the walk, far above what fprintd writes (one small file per finger and
    // device), so a corrupted or planted tree costs bounded work and fails closed.
    static let maxDepth = 8
    static let maxFiles = 1024
    static let maxFileBytes = 4 << 20
    static let maxTotalBytes = 32 << 20
    static let domainSeparation = Array("keyhold biometry domain state v1\0".utf8)

    /// The finger a print file stands for, from its name ("7" → "right-index-finger").
    public static func fingerName(forFileName name: String) -> String? {
        guard let index = fingerIndex(Array(name.utf8)) else { return nil }
        return fingerNames[index]
    }

    /// A name that is one plain path component: non-empty, at most NAME_MAX bytes, no `/`,
    /// no NUL, not `.` or `..`. Anything else could leave `<stateDirectory>/`.
    public static func isAcceptableUserName(_ user: String) -> Bool {
        let b = Array(user.utf8)
        return !b.isEmpty && b.count <= 255 && !b.contains(0x2f) && !b.contains(0) && b != [0x2e] && b != [0x2e, 0x2e]
    }

    /// The domain state of `user`'s enrolled fingers. Never throws: every failure is
    /// `.unreadable`, every "nothing there" is `.noneEnrolled`.
    public static func domainState(user: String, stateDirectory: String = defaultStateDirectory) -> BiometryDomainState {
        guard isAcceptableUserName(user) else { return .unreadable }
        // The state directory itself is the admin's setting and may be a symlink; inside it
        // nothing is followed (O_NOFOLLOW on every component we open).
        let root = open(stateDirectory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard root >= 0 else { return .unreadable }
        defer { close(root) }
        let userDir = openat(root, user, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
        if userDir < 0 { return errno == ENOENT ? .noneEnrolled : .unreadable }

        Sodium.ready()
        var walk = Walk()
        guard walk.begin() else { close(userDir); return .unreadable }
        defer { walk.end() }
        guard walk.directory(userDir, prefix: [], depth: 0) else { return .unreadable }  // closes userDir
        guard walk.files > 0, !walk.fingers.isEmpty else { return .noneEnrolled }
        guard let digest = walk.finish() else { return .unreadable }
        let fingers = walk.fingers.sorted().map { fingerNames[$0] }
        return .enrolled(fingers: fingers, digest: digest)
    }

    static func fingerIndex(_ name: [UInt8]) -> Int? {
        guard name.count == 1 else { return nil }
        switch name[0] {
        case UInt8(ascii: "1")...UInt8(ascii: "9"): return Int(name[0] - UInt8(ascii: "0"))
        case UInt8(ascii: "a"): return 10
        default: return nil
        }
    }
}

/// One depth-first walk over a user's print directory, hashing as it goes so template bytes
/// are never held in memory. Order is deterministic: entries sorted byte-wise per directory,
/// so files come in sorted order of their relative paths (compared component by component).
/// Per file the hash gets: relative path length and bytes, content length and bytes.
private struct Walk {
    var state: UnsafeMutableRawPointer?
    var files = 0
    var totalBytes = 0
    var fingers: Set<Int> = []

    mutating func begin() -> Bool {
        // libsodium wants the BLAKE2b state 64-byte aligned; a Swift stack value may not be.
        let s = UnsafeMutableRawPointer.allocate(byteCount: crypto_generichash_statebytes(), alignment: 64)
        state = s
        guard crypto_generichash_init(OpaquePointer(s), nil, 0, BiometryDigest.byteCount) == 0 else { return false }
        absorb(BiometryStore.domainSeparation)
        return true
    }

    func end() {
        if let s = state {
            sodium_memzero(s, crypto_generichash_statebytes())
            s.deallocate()
        }
    }

    func absorb(_ bytes: [UInt8]) {
        bytes.withUnsafeBufferPointer { _ = crypto_generichash_update(OpaquePointer(state!), $0.baseAddress, UInt64($0.count)) }
    }

    func absorb(length: Int) {
        var v = UInt64(length).littleEndian
        withUnsafeBytes(of: &v) { _ = crypto_generichash_update(OpaquePointer(state!), $0.baseAddress!.assumingMemoryBound(to: UInt8.self), 8) }
    }

    mutating func finish() -> BiometryDigest? {
        absorb(length: files)
        var out = [UInt8](repeating: 0, count: BiometryDigest.byteCount)
        guard crypto_generichash_final(OpaquePointer(state!), &out, out.count) == 0 else { return nil }
        return BiometryDigest(bytes: out)
    }

    /// Walks `fd` (and closes it). False on anything fprintd would not have written.
    mutating func directory(_ fd: Int32, prefix: [UInt8], depth: Int) -> Bool {
        guard depth <= BiometryStore.maxDepth, let dir = fdopendir(fd) else { close(fd); return false }
        defer { closedir(dir) }
        var names: [[UInt8]] = []
        while true {
            errno = 0
            guard let entry = readdir(dir) else {
                if errno != 0 { return false }
                break
            }
            let name: [UInt8] = withUnsafeBytes(of: &entry.pointee.d_name) { raw in
                Array(raw.prefix { $0 != 0 })
            }
            if name == [0x2e] || name == [0x2e, 0x2e] { continue }
            names.append(name)
            if names.count > BiometryStore.maxFiles { return false }
        }
        names.sort { $0.lexicographicallyPrecedes($1) }
        let dirFD = dirfd(dir)
        for name in names {
            let relative = prefix.isEmpty ? name : prefix + [0x2f] + name
            var st = stat()
            let ok = name.withUnsafeBufferPointer { nb -> Bool in
                // names come from readdir, so they hold no NUL; re-terminate for the C calls
                var c = Array(nb) + [0]
                return c.withUnsafeMutableBufferPointer { cb in
                    let path = UnsafeRawPointer(cb.baseAddress!).assumingMemoryBound(to: CChar.self)
                    guard fstatat(dirFD, path, &st, AT_SYMLINK_NOFOLLOW) == 0 else { return false }
                    switch st.st_mode & S_IFMT {
                    case S_IFDIR:
                        let sub = openat(dirFD, path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
                        guard sub >= 0 else { return false }
                        return directory(sub, prefix: relative, depth: depth + 1)
                    case S_IFREG:
                        guard file(dirFD, path, relative: relative) else { return false }
                        if let finger = BiometryStore.fingerIndex(name) { fingers.insert(finger) }
                        return true
                    default:
                        return false  // symlink, fifo, socket, device: never written by fprintd
                    }
                }
            }
            if !ok { return false }
        }
        return true
    }

    /// Hashes one regular file: its relative path, its length, then its bytes.
    mutating func file(_ dirFD: Int32, _ path: UnsafePointer<CChar>, relative: [UInt8]) -> Bool {
        files += 1
        guard files <= BiometryStore.maxFiles else { return false }
        // O_NONBLOCK: a FIFO swapped in after fstatat must not block the broker.
        let fd = openat(dirFD, path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        var st = stat()
        guard fstat(fd, &st) == 0, st.st_mode & S_IFMT == S_IFREG else { return false }
        let size = Int(st.st_size)
        guard size >= 0, size <= BiometryStore.maxFileBytes else { return false }
        totalBytes += size
        guard totalBytes <= BiometryStore.maxTotalBytes else { return false }
        absorb(length: relative.count)
        absorb(relative)
        absorb(length: size)
        var buffer = [UInt8](repeating: 0, count: 16384)
        defer { buffer.withUnsafeMutableBytes { sodium_memzero($0.baseAddress!, $0.count) } }
        var remaining = size
        while remaining > 0 {
            let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress!, min($0.count, remaining)) }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { return false }  // error, or the file shrank under us
            buffer.withUnsafeBufferPointer { _ = crypto_generichash_update(OpaquePointer(state!), $0.baseAddress, UInt64(n)) }
            remaining -= n
        }
        // The file must not have grown either: one extra byte means it changed while read.
        var extra: UInt8 = 0
        return read(fd, &extra, 1) == 0
    }
}
