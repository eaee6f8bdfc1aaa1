import Foundation
import Glibc

/// What the tests' unprivileged users run (the programs, `Tests/fixtures`) must be readable by
/// them. A checkout in a 0700 home or a `mktemp -d` folder is not: every directory on the way
/// must let others pass. Then these copies, made once per test process in a 0755 directory
/// under /tmp (removed at exit), stand in for the originals.
public enum ReadableCopies {
    /// The programs the tests run, as `swift build --build-tests` leaves them in `products`.
    static let programNames = ["keyholdd", "keyhold-pam-helper", "keyhold", "keyhold-bench", "keyhold-secret-service",
                               "git-credential-keyhold", "docker-credential-keyhold"]

    /// True when a user other than the owner may pass through every directory down to `path`
    /// (and so read a 0755 program or 0644 file in it).
    public static func reachableByOthers(_ path: String) -> Bool {
        var dir = URL(fileURLWithPath: path).standardizedFileURL
        while true {
            var st = stat()
            guard stat(dir.path, &st) == 0, st.st_mode & S_IXOTH != 0 else { return false }
            if dir.path == "/" { return true }
            dir = dir.deletingLastPathComponent()
        }
    }

    /// `directory` itself when others reach it; else a readable copy of its programs.
    static func programs(in directory: String) -> String {
        guard !reachableByOthers(directory) else { return directory }
        let copy = TestPaths.temporaryDirectory("khprog")
        chmod(copy, 0o755)
        for name in programNames where access(directory + "/" + name, X_OK) == 0 {
            do { try copyProgram(directory + "/" + name, to: copy + "/" + name) } catch {
                fatalError("cannot copy \(name) where the test users can run it: \(error)")
            }
        }
        return copy
    }

    /// The repository's `Tests/fixtures`, or a readable copy of it.
    public static let fixtures: String = {
        let original = TestPaths.repository + "/Tests/fixtures"
        guard !reachableByOthers(original) else { return original }
        let copy = TestPaths.temporaryDirectory("khfix")
        chmod(copy, 0o755)
        let target = copy + "/fixtures"
        do { try FileManager.default.copyItem(atPath: original, toPath: target) } catch {
            fatalError("cannot copy Tests/fixtures where the test users can read it: \(error)")
        }
        // Readable (and the directories passable) by others whatever the umask was.
        let walker = FileManager.default.enumerator(atPath: target)
        chmod(target, 0o755)
        while let relative = walker?.nextObject() as? String {
            let path = target + "/" + relative
            var st = stat()
            guard lstat(path, &st) == 0 else { continue }
            chmod(path, (st.st_mode & S_IFMT) == S_IFDIR || st.st_mode & S_IXUSR != 0 ? 0o755 : 0o644)
        }
        return target
    }()

    /// `path` as an unprivileged user can open it: a path inside the repository's
    /// `Tests/fixtures` becomes the same path in the readable copy; anything else is unchanged.
    /// Also an argument of the form `NAME=PATH`.
    public static func forOtherUsers(_ argument: String) -> String {
        let original = TestPaths.repository + "/Tests/fixtures"
        if argument.hasPrefix(original + "/") {
            return fixtures + argument.dropFirst(original.count)
        }
        if let eq = argument.firstIndex(of: "="), argument[argument.index(after: eq)...].hasPrefix(original + "/") {
            return String(argument[...eq]) + forOtherUsers(String(argument[argument.index(after: eq)...]))
        }
        return argument
    }
}
