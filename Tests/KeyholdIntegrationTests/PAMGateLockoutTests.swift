import Foundation
import Glibc
import Testing
import KeyholdCore
import KeyholdVault
import KeyholdTestSupport

/// Issue 8, item 4: failed attempts are counted before PAM runs, and counting fails closed.
/// PAM invocations are counted by a pam_exec line first in every auth stack (real libpam).
@Suite(.serialized) struct PAMGateLockoutTests {
    /// pam_exec's log gets the PAM items once per transaction: one PAM_SERVICE line each.
    func pamRuns(_ log: String) -> Int {
        let text = (try? String(contentsOfFile: log, encoding: .utf8)) ?? ""
        return text.split(separator: "\n").filter { $0.hasPrefix("PAM_SERVICE=") }.count
    }

    /// A local user's program guesses the user's password through the broker, 40 requests at
    /// once. Before the fix each read the lockout record before any failure was written, and
    /// all 40 were checked by PAM against a limit of 5.
    @Test func fortyParallelWrongGuessesReachPAMAtMostFiveTimes() throws {
        let user = try TestUser()
        let probe = try BrokerFixture()
        probe.stop()
        let log = probe.directory + "/pam-runs"
        let pamDir = try probe.pamDirectoryLoggingItems(to: log)
        let b = try BrokerFixture(passwords: ["root": "right-password", user.name: "user-password"], pamDirectory: pamDir)
        #expect(b.cli(["put", "token", "x", "--policy", "device-passcode"], stdin: Array("user-secret".utf8), asUser: user.name).status == 0)
        let wrong = b.askpass(answering: "guess", name: "guess")
        // Rounds of 40 separate processes of the user, started together (threads, each its own
        // CLI), until the uid is locked out. A second guess while one is in flight is refused
        // without PAM; every guess PAM checks is counted first.
        var rounds = 0
        var lastRound: [Int32] = []
        repeat {
            let statuses = StatusBox()
            let group = DispatchGroup()
            for _ in 0..<40 {
                group.enter()
                Thread.detachNewThread {
                    statuses.add(b.cli(["get", "token", "x"], environment: ["KEYHOLD_ASKPASS": wrong], asUser: user.name).status)
                    group.leave()
                }
            }
            group.wait()
            lastRound = statuses.all
            #expect(lastRound.count == 40 && !lastRound.contains(0), "\(lastRound)")
            #expect(pamRuns(log) <= 5, "PAM ran \(pamRuns(log)) times after \(rounds + 1) round(s) of 40 parallel guesses")
            rounds += 1
        } while pamRuns(log) < 5 && rounds < 8
        let runs = pamRuns(log)
        #expect(runs == 5, "PAM ran \(runs) times")
        // The count stands: even the right password is refused now, without PAM running.
        let right = b.cli(["get", "token", "x"], environment: ["KEYHOLD_ASKPASS": b.askpass(answering: "user-password", name: "right")],
                          asUser: user.name)
        #expect(right.status == 9 && right.stdout.isEmpty, "\(right.stderr)")
        #expect(pamRuns(log) == runs)
    }

    /// The lockout table refuses writes (a real SQLite error, from a trigger put in while the
    /// broker was down). Before the fix the write was `try?`: every guess reached PAM.
    @Test func lockoutRecordWriteFailureLocksOut() throws {
        let probe = try BrokerFixture()
        probe.stop()
        let log = probe.directory + "/pam-runs"
        let b = try BrokerFixture(passwords: ["root": "right-password"], pamDirectory: try probe.pamDirectoryLoggingItems(to: log))
        #expect(b.cli(["put", "gated", "x", "--policy", "device-passcode"], stdin: Array("v".utf8)).status == 0)
        b.stop()
        do {
            let db = try Database(path: b.stateDirectory + "/vault.db")
            try db.execute("""
                CREATE TRIGGER lockout_refuses_insert BEFORE INSERT ON lockout BEGIN SELECT RAISE(ABORT, 'refused'); END;
                CREATE TRIGGER lockout_refuses_update BEFORE UPDATE ON lockout BEGIN SELECT RAISE(ABORT, 'refused'); END;
                """)
            db.close()
        }
        try b.start()
        let wrong = ["KEYHOLD_ASKPASS": b.askpass(answering: "guess", name: "guess")]
        for i in 1...8 {
            let r = b.cli(["get", "gated", "x"], environment: wrong)
            #expect(r.status == 12 && r.stdout.isEmpty, "guess \(i): \(r.status) \(r.stderr)")
        }
        #expect(pamRuns(log) == 0)
        // Nothing is released while the count cannot be kept, not even for the right password.
        let right = b.cli(["get", "gated", "x"], environment: ["KEYHOLD_ASKPASS": b.askpass(answering: "right-password", name: "right")])
        #expect(right.status == 12 && right.stdout.isEmpty)
        #expect(pamRuns(log) == 0)
        // Refusals are audited.
        let audit = b.cli(["audit", "--json", "--item", "gated/x"]).stdoutText
        #expect(audit.split(separator: "\n").filter { $0.contains("\"outcome\":\"audit-unavailable\"") }.count == 9)
        // Once the fault is gone, the right password works again.
        b.stop()
        do {
            let db = try Database(path: b.stateDirectory + "/vault.db")
            try db.execute("DROP TRIGGER lockout_refuses_insert; DROP TRIGGER lockout_refuses_update;")
            db.close()
        }
        try b.start()
        expectSecret(b.cli(["get", "gated", "x"], environment: ["KEYHOLD_ASKPASS": b.askpass(answering: "right-password", name: "right2")]).stdoutText, equals: "v")
    }

    /// The lockout record cannot be *read*: the uid's row is corrupted in the file while the
    /// broker is down (its record header claims more bytes than the row holds), so SQLite
    /// answers SQLITE_CORRUPT to reading it, while writing the row over would still succeed.
    /// A record that cannot be read is never "not locked out": nothing is released, PAM never runs.
    @Test func lockoutRecordReadFailureLocksOut() throws {
        let probe = try BrokerFixture()
        probe.stop()
        let log = probe.directory + "/pam-runs"
        let b = try BrokerFixture(passwords: ["root": "right-password"], pamDirectory: try probe.pamDirectoryLoggingItems(to: log))
        #expect(b.cli(["put", "gated", "x", "--policy", "device-passcode"], stdin: Array("v".utf8)).status == 0)
        #expect(b.cli(["put", "open", "x"], stdin: Array("o".utf8)).status == 0)
        // One wrong guess: root's lockout row exists (1 failure).
        #expect(b.cli(["get", "gated", "x"], environment: ["KEYHOLD_ASKPASS": b.askpass(answering: "guess", name: "guess")]).status == 6)
        #expect(pamRuns(log) == 1)
        b.stop()
        let path = b.stateDirectory + "/vault.db"
        let (offset, original) = try corruptLockoutRow(path)
        try b.start()
        let right = ["KEYHOLD_ASKPASS": b.askpass(answering: "right-password", name: "right")]
        for i in 1...3 {
            let r = b.cli(["get", "gated", "x"], environment: right)
            #expect(r.status == 12 && r.stdout.isEmpty, "attempt \(i): \(r.status) \(r.stderr)")
        }
        #expect(pamRuns(log) == 1, "PAM never ran while the record could not be read")
        // Items that need no authentication are untouched; the listing still has both.
        let ungated = b.cli(["get", "open", "x"])
        #expect(ungated.status == 0)
        expectSecret(ungated.stdoutText, equals: "o")
        let listed = b.cli(["ls"]).stdoutText
        #expect(listed.contains("gated") && listed.contains("open"))
        // `state` says so too: the ungated item is available, the gated one is refused (12).
        let openState = b.cli(["state", "open", "x"])
        #expect(openState.status == 0 && openState.stdoutText == "available\n", "\(openState.status) \(openState.stderr)")
        #expect(b.cli(["state", "gated", "x"]).status == 12)
        let audit = b.cli(["audit", "--json", "--item", "gated/x"]).stdoutText.split(separator: "\n").filter { $0.contains("\"operation\":\"get\"") }
        #expect(audit.filter { $0.contains("\"outcome\":\"audit-unavailable\"") }.count == 3, "each refusal is audited")
        #expect(!audit.contains { $0.contains("\"granted\"") })
        // With the byte put back, the right password releases the item.
        b.stop()
        let fd = open(path, O_WRONLY)
        #expect(fd >= 0 && pwrite(fd, [original], 1, offset) == 1)
        close(fd)
        try b.start()
        let after = b.cli(["get", "gated", "x"], environment: right)
        #expect(after.status == 0)
        expectSecret(after.stdoutText, equals: "v")
        #expect(pamRuns(log) == 2)
    }

    /// Makes the one lockout row's record-header size larger than its payload (after a
    /// checkpoint into the main file); returns the byte's offset and what it held.
    func corruptLockoutRow(_ path: String) throws -> (off_t, UInt8) {
        let db = try Database(path: path)
        _ = try db.pragma("wal_checkpoint(TRUNCATE)")
        let root = try db.withStatement("SELECT rootpage FROM sqlite_master WHERE name = 'lockout'") { (s) throws(DatabaseError) in
            try s.step() ? s.int64(0) : 0
        }
        let pageSize = Int(try db.pragma("page_size") ?? "") ?? 0
        db.close()
        #expect(root > 1 && pageSize > 0)
        let pageStart = off_t(Int(root - 1) * pageSize)
        let fd = open(path, O_RDWR)
        defer { close(fd) }
        var page = [UInt8](repeating: 0, count: pageSize)
        #expect(pread(fd, &page, pageSize, pageStart) == pageSize)
        // A table leaf page with one cell: payload size and rowid (uid 0) are one-byte varints,
        // then the record, whose first byte is its header's size.
        #expect(page[0] == 0x0D && page[3] == 0 && page[4] == 1, "one row in a table leaf page")
        let cell = Int(page[8]) << 8 | Int(page[9])
        let payload = page[cell]
        #expect(payload < 0x80 && page[cell + 1] == 0)
        let offset = pageStart + off_t(cell + 2)
        let original = page[cell + 2]
        #expect(pwrite(fd, [payload + 1], 1, offset) == 1)
        return (offset, original)
    }
}

final class StatusBox: @unchecked Sendable {
    private let lock = NSLock()
    private var values: [Int32] = []
    func add(_ v: Int32) { lock.lock(); values.append(v); lock.unlock() }
    var all: [Int32] { lock.lock(); defer { lock.unlock() }; return values }
}
