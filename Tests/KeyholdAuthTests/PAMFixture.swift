import Foundation
import KeyholdCore
@testable import KeyholdAuth
import KeyholdTestSupport

/// Shared fixture of the PAM tests: the `pam/test` stacks of this repository, the keyholdd
/// binary as helper, and one test passdb for the whole test process (PAM_MATRIX_PASSWD is
/// process-global, so it is written and exported once, and removed at exit).
enum PAMFixture {
    static let repoRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .deletingLastPathComponent().deletingLastPathComponent()
    static let testStacks = PAMTestStacks.directory
    static let helper = TestPaths.pamHelper

    static let passdbDirectory: String = {
        var template = Array("/tmp/kh-pamdb-XXXXXX".utf8CString)
        let dir = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)!) }
        let passdb = dir + "/passdb"
        // user:password:service (pam_matrix). One user per service: only the first line counts.
        let lines = ["alice:s3cret:keyhold-passcode", "carol:c4rol:keyhold", "dave:d4ve:custom"]
        _ = FileManager.default.createFile(atPath: passdb, contents: Data((lines.joined(separator: "\n") + "\n").utf8))
        setenv("PAM_MATRIX_PASSWD", passdb, 1)
        atexit { removePassdb() }
        return dir
    }()

    /// Ensures the passdb exists and PAM_MATRIX_PASSWD points at it before any helper spawns.
    static func ready() { _ = passdbDirectory }

    static func authenticator(_ dir: String? = nil, deadline: Int = 120) -> PAMAuthenticator {
        ready()
        return PAMAuthenticator(helperExecutable: helper, serviceDirectory: dir ?? testStacks, deadlineSeconds: deadline)
    }

    static func secret(_ s: String) -> SecureBytes { SecureBytes(copying: Array(s.utf8)) }

    /// A temporary directory (short path) removed by the caller.
    static func tempDirectory() -> String {
        var template = Array("/tmp/kh-pam-XXXXXX".utf8CString)
        return template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)!) }
    }

    static func write(_ text: String, to path: String, mode: Int = 0o644) {
        _ = FileManager.default.createFile(atPath: path, contents: Data(text.utf8), attributes: [.posixPermissions: mode])
    }

    static func openFDCount() -> Int {
        (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd").count) ?? -1
    }

    static func rssKiB() -> Int {
        guard let s = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8),
              let line = s.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") }) else { return -1 }
        return Int(line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first ?? "") ?? -1
    }

    /// True once no process with `marker` in its command line is left. SIGKILL is delivered
    /// asynchronously, so this waits (bounded, up to 5 s) instead of looking once.
    static func allGone(_ marker: String) -> Bool {
        for _ in 0..<500 {
            if processes(containing: marker).isEmpty { return true }
            usleep(10_000)
        }
        return false
    }

    /// Pids of live processes whose command line contains `marker`.
    static func processes(containing marker: String) -> [Int32] {
        let entries = (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []
        return entries.compactMap { name -> Int32? in
            guard let pid = Int32(name), let data = FileManager.default.contents(atPath: "/proc/\(name)/cmdline") else { return nil }
            let cmd = String(decoding: data.map { $0 == 0 ? 0x20 : $0 }, as: UTF8.self)
            return cmd.contains(marker) ? pid : nil
        }
    }
}

private func removePassdb() {
    let dir = PAMFixture.passdbDirectory
    try? FileManager.default.removeItem(atPath: dir)
}

/// Records what the conversation saw and answers from a script.
final class RecordingConversation {
    var messages: [PAMMessage] = []
    let reply: (PAMMessage) -> PAMAnswer
    init(_ reply: @escaping (PAMMessage) -> PAMAnswer) { self.reply = reply }
    func callAsFunction(_ m: PAMMessage) -> PAMAnswer {
        messages.append(m)
        return reply(m)
    }

    static func password(_ pw: String) -> RecordingConversation {
        RecordingConversation { m in m.isPrompt ? .answer(PAMFixture.secret(pw)) : .answer(SecureBytes(count: 0)) }
    }
}
