import Foundation
import Glibc
import Synchronization
import Testing
import KeyholdClient
import KeyholdCore
import KeyholdVault
import KeyholdTestSupport

/// `get` beside the broker's long-read reader, through a real broker over its socket:
/// what one client's acknowledged put wrote is what the next get of another client finds; a
/// policy tightened while gets race it never releases the new secret without authentication;
/// the WAL stays bounded while readers are in use, and is removed at a clean stop.
@Suite(.serialized, .timeLimit(.minutes(5))) struct ReaderThroughBrokerTests {
    static func bytes(_ s: String) -> SecureBytes { SecureBytes(copying: Array(s.utf8)) }
    static func text(_ s: SecureBytes) -> String { s.withUnsafeBytes { String(decoding: $0, as: UTF8.self) } }

    /// Descriptors the broker has open on `path` (the writer and its readers).
    static func descriptors(_ pid: Int32, on path: String) -> Int {
        let dir = "/proc/\(pid)/fd"
        let fds = (try? FileManager.default.contentsOfDirectory(atPath: dir)) ?? []
        return fds.filter { (try? FileManager.default.destinationOfSymbolicLink(atPath: dir + "/" + $0)) == path }.count
    }

    /// Gets of other items from `threads` threads until `stop`: group commits and lookups run
    /// while the test's own requests do.
    static func load(_ vault: Vault, threads: Int, stop: Flag) -> DispatchSemaphore {
        let done = DispatchSemaphore(value: 0)
        for t in 0..<threads {
            let thread = Thread {
                while !stop.isSet { (try? vault.secret(service: "load", account: "a\(t % 4)"))?.wipe() }
                done.signal()
            }
            thread.start()
        }
        return done
    }

    @Test func anAcknowledgedPutIsSeenByTheNextGetOfAnotherClient() throws {
        let b = try BrokerFixture()
        #expect(Self.descriptors(b.process!.processIdentifier, on: b.stateDirectory + "/vault.db") == 2)  // the writer and the long-read reader
        let writer = Vault(socketPath: b.socketPath), reader = Vault(socketPath: b.socketPath)
        for i in 0..<4 { try writer.add(Self.bytes("l\(i)"), service: "load", account: "a\(i)") }
        let stop = Flag()
        let loaders = Self.load(Vault(socketPath: b.socketPath), threads: 6, stop: stop)
        defer { stop.set(); for _ in 0..<6 { loaders.wait() } }

        var stale = 0, missing = 0
        try writer.add(Self.bytes("v0"), service: "raw", account: "x")
        for i in 1...300 {
            try writer.update(Self.bytes("v\(i)"), service: "raw", account: "x")
            if Self.text(try reader.secret(service: "raw", account: "x")) != "v\(i)" { stale += 1 }
            try writer.add(Self.bytes("n\(i)"), service: "raw", account: "n\(i)")
            do {
                if Self.text(try reader.secret(service: "raw", account: "n\(i)")) != "n\(i)" { stale += 1 }
            } catch { missing += 1 }
        }
        #expect(stale == 0)
        #expect(missing == 0)
    }

    /// Each of 30 `none` items is replaced by a new secret under `device-passcode` while four
    /// clients get it in a loop without interaction: a get decided on the old row (no
    /// authentication) must never carry the new secret (the release re-reads the row under the
    /// store lock and answers *conflict*).
    @Test func aPolicyTightenedWhileGetsRaceNeverReleasesTheNewSecretWithoutAuthentication() throws {
        let b = try BrokerFixture()
        let vault = Vault(socketPath: b.socketPath)
        let gated = AccessControl(policy: try Policy(parsing: "device-passcode"))
        let leaked = LockedCounter(), olds = LockedCounter(), refusals = LockedCounter(), conflicts = LockedCounter()
        for k in 0..<30 {
            try vault.add(Self.bytes("old"), service: "tighten", account: "t\(k)")
            let stop = Flag()
            let done = DispatchSemaphore(value: 0)
            for _ in 0..<4 {
                Thread {
                    let mine = Vault(socketPath: b.socketPath)
                    while !stop.isSet {
                        do {
                            let s = try mine.secret(service: "tighten", account: "t\(k)")
                            if Self.text(s) == "old" { olds.add() } else { leaked.add() }
                            s.wipe()
                        } catch {
                            refusals.add()  // conflict, or interaction-not-allowed once tightened
                            if case KeyholdError.conflict = error { conflicts.add() }
                        }
                    }
                    done.signal()
                }.start()
            }
            usleep(2_000)
            try vault.update(Self.bytes("new-secret"), service: "tighten", account: "t\(k)", access: gated)
            usleep(2_000)
            stop.set()
            for _ in 0..<4 { done.wait() }
        }
        #expect(leaked.value == 0)
        #expect(olds.value > 0)
        #expect(refusals.value > 0)
        print("tightening: \(olds.value) old secrets, \(refusals.value) refusals of which \(conflicts.value) conflicts (decided on the old row, refused at release), \(leaked.value) leaked")
    }

    /// An older copy's rows, generation record and audit head written into the live file under
    /// a running broker with `--rollback-anchor` (the reader's lookup finds the removed token:
    /// every check of the row passes). The get's release goes through the store lock, where the
    /// rollback check refuses it: nothing is released, and every later get answers *integrity*.
    @Test func aRollbackIntoTheLiveFileServesNoGet() throws {
        let outside = TestPaths.temporaryDirectory("kha")
        defer { try? FileManager.default.removeItem(atPath: outside) }
        let b = try BrokerFixture(extraArguments: ["--key-protector", "file", "--rollback-anchor", outside + "/anchor"])
        let vault = Vault(socketPath: b.socketPath)
        try vault.add(Self.bytes("old-token"), service: "revoked", account: "token")
        try vault.add(Self.bytes("other"), service: "other", account: "x")
        let live = b.stateDirectory + "/vault.db", snapshot = b.directory + "/snapshot.db"
        let db = try Database(path: live)
        defer { db.close() }
        try db.execute("VACUUM INTO '\(snapshot)'")
        try vault.delete(service: "revoked", account: "token")
        try db.execute(restoreVaultRowsSQL(from: snapshot))
        for (service, account) in [("revoked", "token"), ("other", "x"), ("revoked", "token")] {
            do {
                let s = try Vault(socketPath: b.socketPath).secret(service: service, account: account)
                Issue.record("released \(service) after the rollback: \(s.count) bytes")
            } catch {
                guard case KeyholdError.integrityFailure = error else { Issue.record("\(error)"); continue }
            }
        }
        #expect(b.brokerLog.contains("the vault was restored from an older copy"))
    }

    /// Gets and puts from many clients with the readers in use: readers hold a snapshot only for
    /// one lookup, so checkpoints keep completing and the WAL file (SQLite reuses it from the
    /// start after a complete checkpoint; the file never shrinks while open) stays near the
    /// autocheckpoint size instead of growing with every commit. At a clean stop the readers
    /// close before the writer, whose close checkpoints and removes the WAL.
    @Test func theWALStaysBoundedWithReadersInUseAndIsRemovedAtStop() throws {
        let b = try BrokerFixture()
        let wal = b.stateDirectory + "/vault.db-wal"
        #expect(Self.descriptors(b.process!.processIdentifier, on: b.stateDirectory + "/vault.db") == 2)
        let vault = Vault(socketPath: b.socketPath)
        for i in 0..<4 { try vault.add(Self.bytes("l\(i)"), service: "load", account: "a\(i)") }
        for i in 0..<20 { try vault.add(Self.bytes(String(repeating: "p", count: 3000)), service: "put", account: "p\(i)") }

        let stop = Flag()
        let largest = Mutex(0)
        let sampler = Thread {
            while !stop.isSet {
                var st = stat()
                if stat(wal, &st) == 0 { largest.withLock { $0 = max($0, Int(st.st_size)) } }
                usleep(1_000)
            }
        }
        sampler.start()
        let loaders = Self.load(vault, threads: 8, stop: stop)
        let puts = LockedCounter(), failures = LockedCounter()
        runThreads(4) { t in
            let mine = Vault(socketPath: b.socketPath)
            for i in 0..<1200 {
                // A fresh 3 kB secret each time: a page of its own for the row, and the index and
                // the audit entry rewritten with it.
                let value = String(repeating: Character(UnicodeScalar(UInt8(97 + (i % 26)))), count: 3000)
                do {
                    try mine.update(Self.bytes(value), service: "put", account: "p\(t * 5 + i % 5)")
                    puts.add()
                } catch { failures.add() }
            }
        }
        stop.set()
        for _ in 0..<8 { loaders.wait() }
        usleep(5_000)

        let db = try Database(path: b.stateDirectory + "/vault.db", readOnly: true)
        let pageSize = Int(try db.pragma("page_size") ?? "") ?? 0, autocheckpointPages = 1000
        db.close()
        let bound = 2 * autocheckpointPages * pageSize
        // Without checkpoints the WAL would hold at least one page per put (its 3 kB row alone).
        let grew = largest.withLock { $0 }
        print("WAL: largest \(grew) bytes over \(puts.value) puts (bound \(bound))")
        #expect(puts.value * pageSize > 2 * bound, "the test writes too little to show a bound")
        #expect(failures.value == 0)
        #expect(grew > 0)
        #expect(grew <= bound, "WAL grew to \(grew) bytes")

        b.stop()
        #expect(access(wal, F_OK) != 0, "the WAL was left behind at a clean stop")
        #expect(!b.brokerLog.contains("no read-only connection"))
    }
}

/// A stop signal shared with worker threads.
final class Flag: Sendable {
    private let value = Mutex(false)
    var isSet: Bool { value.withLock { $0 } }
    func set() { value.withLock { $0 = true } }
}
