import Foundation
@testable import KeyholdCore
@testable import KeyholdVault
import KeyholdTestSupport
import Testing

/// kill -9 during a stream of writes loses nothing that was acknowledged.
///
/// The writer is this same test binary re-run with `KH_DURABILITY_CHILD=<state dir>`, so the
/// kill hits a real separate process in the middle of SQLite commits.
@Suite struct DurabilityTests {
    static let childDirectory = ProcessInfo.processInfo.environment["KH_DURABILITY_CHILD"]

    /// Child side: add items forever, printing each one after `add` returned.
    @Test(.enabled(if: childDirectory != nil)) func durabilityChildWriter() throws {
        let store = try VaultStore.open(stateDirectory: Self.childDirectory!, passwordHashing: .interactive)
        var i = 0
        while true {
            _ = try store.add(owner: 1000, NewItem(service: "svc", account: "a\(i)"), secret: secret("s\(i)"), audit: record())
            if i % 3 == 0 { try store.append(record(.get)) }
            FileHandle.standardOutput.write(Data("ACK \(i)\n".utf8))
            i += 1
        }
    }

    @Test(.enabled(if: childDirectory == nil)) func killNineLosesNoAcknowledgedWrite() throws {
        let dir = TempDir()
        _ = try openStore(dir)  // create the vault first, so the child only writes
        let child = Process()
        child.executableURL = URL(fileURLWithPath: CommandLine.arguments[0])
        child.arguments = ["--testing-library", "swift-testing", "--filter", "durabilityChildWriter"]
        var env = ProcessInfo.processInfo.environment
        env["KH_DURABILITY_CHILD"] = dir.state
        env["SWIFT_BACKTRACE"] = "enable=no"
        child.environment = env
        let pipe = Pipe()
        child.standardOutput = pipe
        child.standardError = FileHandle.nullDevice
        try child.run()
        defer { if child.isRunning { kill(child.processIdentifier, SIGKILL) }; child.waitUntilExit() }

        // Read acknowledgements until enough have arrived, then kill mid-stream.
        var acknowledged = -1
        var buffer = ""
        let reader = pipe.fileHandleForReading
        while acknowledged < 150 {
            let chunk = reader.availableData
            if chunk.isEmpty { break }  // child ended early: fail below
            buffer += String(decoding: chunk, as: UTF8.self)
            while let nl = buffer.firstIndex(of: "\n") {
                let line = buffer[..<nl]
                buffer = String(buffer[buffer.index(after: nl)...])
                if line.hasPrefix("ACK "), let n = Int(line.dropFirst(4)) { acknowledged = n }
            }
        }
        kill(child.processIdentifier, SIGKILL)
        child.waitUntilExit()
        #expect(acknowledged >= 150)

        let store = try openStore(dir)
        #expect(try store.db.pragma("integrity_check") == "ok")
        for i in 0...acknowledged {
            let item = try #require(try store.item(owner: 1000, service: "svc", account: "a\(i)"), "acknowledged item \(i) lost")
            try expectSecret(string(store.openSecret(item)), equals: "s\(i)")
        }
        // The chain is whole: the write in flight either landed with its entry or not at all.
        guard case .intact(let count) = try store.verifyAudit() else {
            Issue.record("audit chain broken after kill -9")
            return
        }
        let items = try store.items(owner: 1000)
        #expect(items.damaged == 0)
        #expect(count >= Int64(items.items.count))
    }
}
