import Foundation
import Glibc
import Synchronization

/// A test that writes to a child's stdin or a socket the broker already closed (a busy
/// answer, a frame deadline) must see EPIPE, not kill the whole test process with SIGPIPE.
/// Runs once, from every fixture and command helper.
public let ignoreBrokenPipes: Void = { signal(SIGPIPE, SIG_IGN); return () }()

/// Where the built products and the repository are, seen from a test process.
public enum TestPaths {
    /// The directory holding `keyholdd` and `keyhold` (next to the test bundle), or, when the
    /// checkout sits where other users cannot reach it (a 0700 home, a `mktemp -d` folder), a
    /// copy of the programs where they can: the unprivileged test users run them too.
    public static let products: String = {
        ignoreBrokenPipes
        let exe = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
        var dir = URL(fileURLWithPath: exe).deletingLastPathComponent()
        // swift-testing may run the bundle from inside <name>.xctest/…
        while !FileManager.default.fileExists(atPath: dir.appendingPathComponent("keyholdd").path), dir.path != "/" {
            dir = dir.deletingLastPathComponent()
        }
        return ReadableCopies.programs(in: dir.path)
    }()

    public static var keyholdd: String { products + "/keyholdd" }
    /// The PAM helper keyholdd starts for each transaction (it looks beside itself).
    public static var pamHelper: String { products + "/keyhold-pam-helper" }
    /// The CLI is linked statically, so no test target may depend on it (SwiftPM would link its
    /// flags into the test bundle); `swift build --build-tests` builds it beside `keyholdd`.
    public static var keyhold: String {
        let path = products + "/keyhold"
        precondition(access(path, X_OK) == 0, "\(path) is not built: run `swift build --build-tests` first")
        return path
    }

    /// The repository root (for `pam/test` and `schema.sql`).
    public static let repository: String = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent().path

    /// A fresh, short temporary directory (Unix socket paths must stay under 108 bytes),
    /// removed when the test process exits if the test did not remove it itself (a release
    /// gate's PAM stack or a socket's directory is used until the test ends).
    public static func temporaryDirectory(_ prefix: String = "kh") -> String {
        var template = Array("/tmp/\(prefix)-XXXXXX".utf8CString)
        guard let p = mkdtemp(&template) else { fatalError("mkdtemp failed") }
        let path = String(cString: p)
        MadeDirectories.shared.add(path)
        return path
    }
}

/// The directories `TestPaths.temporaryDirectory` made, removed at exit (a run used to leave
/// dozens behind in /tmp).
private final class MadeDirectories: @unchecked Sendable {
    static let shared: MadeDirectories = {
        atexit { MadeDirectories.shared.removeAll() }
        return MadeDirectories()
    }()
    private let lock = NSLock()
    private var paths: [String] = []

    func add(_ path: String) {
        lock.lock()
        paths.append(path)
        lock.unlock()
    }

    func removeAll() {
        lock.lock()
        let made = paths
        paths = []
        lock.unlock()
        for path in made { try? FileManager.default.removeItem(atPath: path) }
    }
}
