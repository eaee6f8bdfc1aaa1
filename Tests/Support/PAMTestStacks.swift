import Foundation
import Glibc

/// The `pam/test` stacks, made usable on any Debian architecture: pam_matrix lives in
/// /usr/lib/<multiarch>/pam_wrapper/, outside libpam's module directory, so the stacks name it
/// `@PAM_MATRIX@` and tests use a copy with the path found on this machine.
public enum PAMTestStacks {
    /// pam_matrix.so from libpam-wrapper, on whatever architecture this is.
    public static let matrixModule: String = {
        let lib = "/usr/lib"
        let found = ((try? FileManager.default.contentsOfDirectory(atPath: lib)) ?? []).sorted()
            .map { "\(lib)/\($0)/pam_wrapper/pam_matrix.so" } + ["\(lib)/pam_wrapper/pam_matrix.so"]
        return found.first { access($0, R_OK) == 0 } ?? "pam_matrix.so"
    }()

    /// A private copy of `pam/test` with `@PAM_MATRIX@` replaced (made once per test process).
    public static let directory: String = {
        let source = TestPaths.repository + "/pam/test"
        let dir = TestPaths.temporaryDirectory("khpamtest")
        for name in (try? FileManager.default.contentsOfDirectory(atPath: source)) ?? [] {
            guard let text = try? String(contentsOfFile: source + "/" + name, encoding: .utf8) else { continue }
            try? text.replacingOccurrences(of: "@PAM_MATRIX@", with: matrixModule)
                .write(toFile: dir + "/" + name, atomically: true, encoding: .utf8)
        }
        atexit { _ = try? FileManager.default.removeItem(atPath: PAMTestStacks.directory) }
        return dir
    }()
}
