import Foundation
import KeyholdCore
import KeyholdVault
import KeyholdTestSupport
import Testing

@Suite struct AuditTests {
    /// A vault with `n` audit entries (seq 1...n), closed.
    private func seeded(_ n: Int) throws -> TempDir {
        let dir = TempDir()
        let store = try openStore(dir)
        for i in 1...n {
            try store.append(record(.get, uid: i % 2 == 0 ? 1000 : 1001, service: "svc\(i)", account: "acct",
                                    reason: "reason \(i)", method: .password, outcome: .ok))
        }
        store.close()
        return dir
    }

    private func verify(_ dir: TempDir) throws -> AuditVerification {
        try openStore(dir).verifyAudit()
    }

    private func raw(_ dir: TempDir) throws -> RawDatabase { try RawDatabase(dir.state + "/vault.db") }

    @Test func emptyAndUntouchedLogsVerify() throws {
        let empty = TempDir()
        #expect(try openStore(empty).verifyAudit() == .intact(count: 0))
        let dir = try seeded(10)
        #expect(try verify(dir) == .intact(count: 10))
        // Appends continue the chain across reopen.
        let store = try openStore(dir)
        try store.append(record(.list))
        #expect(try store.verifyAudit() == .intact(count: 11))
    }

    @Test func entriesAreDecryptedAndFiltered() throws {
        let dir = try seeded(6)
        let store = try openStore(dir)
        let all = try store.auditEntries(visibleTo: nil)
        #expect(all.map(\.seq) == [1, 2, 3, 4, 5, 6])
        #expect(all[2].readable.service == "svc3" && all[2].readable.account == "acct" && all[2].readable.reason == "reason 3")
        #expect(all[2].readable.operation == "get" && all[2].readable.decision == "granted" && all[2].readable.method == "password" && all[2].readable.outcome == "ok")
        #expect(all[2].readable.executable == "/usr/bin/kh-test-client" && all[2].readable.callerPID == 4242 && all[2].detailsIntact)
        // A user sees only their own requests.
        #expect(try store.auditEntries(visibleTo: 1000).map(\.seq) == [2, 4, 6])
        #expect(try store.auditEntries(visibleTo: 1001).map(\.seq) == [1, 3, 5])
        #expect(try store.auditEntries(visibleTo: 4).isEmpty)
        #expect(try store.auditEntries(visibleTo: nil, afterSeq: 4).map(\.seq) == [5, 6])
        #expect(try store.auditEntries(visibleTo: nil, item: ("svc5", "acct")).map(\.seq) == [5])
        #expect(try store.auditEntries(visibleTo: 1000, item: ("svc5", "acct")).isEmpty)
        #expect(try store.auditEntries(visibleTo: nil, since: Int64.max).isEmpty)
        #expect(try store.auditEntries(visibleTo: nil, since: all[3].readable.time).first.map { $0.seq <= 4 } == true)
        #expect(try store.auditEntries(visibleTo: nil, limit: 2).count == 2)
    }

    @Test func mutationsAndTheirEntriesLandTogether() throws {
        let dir = TempDir()
        let store = try openStore(dir)
        let added = try store.add(owner: 1000, NewItem(service: "s", account: "a"), secret: secret("x"),
                                  audit: record(.put, service: "s", account: "a"))
        let entries = try store.auditEntries(visibleTo: nil)
        #expect(entries.count == 1)
        #expect(entries[0].readable.itemID == added.id.description)  // filled in by the store
        #expect(entries[0].readable.operation == "put")
    }

    @Test func editedFieldIsNamed() throws {
        let dir = try seeded(8)
        try raw(dir).exec("UPDATE audit SET outcome = 'not-found' WHERE seq = 5")
        #expect(try verify(dir) == .broken(seq: 5, problem: .altered))

        let dir2 = try seeded(8)
        try raw(dir2).exec("UPDATE audit SET caller_uid = 0 WHERE seq = 1")
        #expect(try verify(dir2) == .broken(seq: 1, problem: .altered))

        let dir3 = try seeded(8)
        try raw(dir3).exec("UPDATE audit SET time_us = time_us + 1 WHERE seq = 8")
        #expect(try verify(dir3) == .broken(seq: 8, problem: .altered))

        // A sealed detail box edited: verify names it, and the view says the row is damaged.
        let dir4 = try seeded(8)
        let box = try raw(dir4).blobs("SELECT details FROM audit WHERE seq = 3")[0]
        var edited = box
        edited[30] ^= 1
        try raw(dir4).setBlob("audit", "details", edited, where: "seq = 3")
        #expect(try verify(dir4) == .broken(seq: 3, problem: .altered))
        #expect(try openStore(dir4).auditEntries(visibleTo: nil)[2].detailsIntact == false)

        // Only the MAC column edited.
        let dir5 = try seeded(8)
        try raw(dir5).setBlob("audit", "mac", [UInt8](repeating: 0, count: 32), where: "seq = 4")
        #expect(try verify(dir5) == .broken(seq: 4, problem: .altered))
    }

    @Test func deletedMiddleEntryIsNamed() throws {
        let dir = try seeded(8)
        try raw(dir).exec("DELETE FROM audit WHERE seq = 4")
        #expect(try verify(dir) == .broken(seq: 4, problem: .removed))
        let dir2 = try seeded(8)
        try raw(dir2).exec("DELETE FROM audit WHERE seq IN (1, 2)")
        #expect(try verify(dir2) == .broken(seq: 1, problem: .removed))
    }

    @Test func swappedEntriesAreNamed() throws {
        // Swap every column but seq between rows 3 and 6.
        let dir = try seeded(8)
        let db = try raw(dir)
        try db.exec("""
            UPDATE audit SET seq = -3 WHERE seq = 3;
            UPDATE audit SET seq = 3 WHERE seq = 6;
            UPDATE audit SET seq = 6 WHERE seq = -3;
            """)
        #expect(try verify(dir) == .broken(seq: 3, problem: .reordered))
        // Adjacent rows.
        let dir2 = try seeded(8)
        try raw(dir2).exec("""
            UPDATE audit SET seq = -5 WHERE seq = 5;
            UPDATE audit SET seq = 5 WHERE seq = 6;
            UPDATE audit SET seq = 6 WHERE seq = -5;
            """)
        #expect(try verify(dir2) == .broken(seq: 5, problem: .reordered))
    }

    @Test func forgedEntryIsNamed() throws {
        // Inserted in the middle, later entries renumbered to make room.
        let dir = try seeded(8)
        let db = try raw(dir)
        try db.exec("""
            UPDATE audit SET seq = -seq WHERE seq >= 4;
            UPDATE audit SET seq = 1 - seq WHERE seq < 0;
            INSERT INTO audit (seq, time_us, caller_uid, caller_pid, executable, operation, item_id, details, decision,
                method, outcome, entry_tag, mac)
            SELECT 4, time_us, 0, 1, '/bin/forged', 'get', NULL, NULL, 'granted', 'none', 'ok', entry_tag, mac
            FROM audit WHERE seq = 3;
            """)
        #expect(try db.int("SELECT max(seq) FROM audit") == 9)
        #expect(try verify(dir) == .broken(seq: 4, problem: .inserted))

        // A genuine entry replayed (copied) into the middle.
        let dir2 = try seeded(8)
        let db2 = try raw(dir2)
        try db2.exec("""
            UPDATE audit SET seq = -seq WHERE seq >= 4;
            UPDATE audit SET seq = 1 - seq WHERE seq < 0;
            INSERT INTO audit SELECT 4, time_us, caller_uid, caller_pid, executable, operation, item_id, details, decision,
                method, outcome, entry_tag, mac FROM audit WHERE seq = 2;
            """)
        #expect(try verify(dir2) == .broken(seq: 4, problem: .inserted))

        // Appended after the head.
        let dir3 = try seeded(8)
        try raw(dir3).exec("""
            INSERT INTO audit SELECT 9, time_us, caller_uid, caller_pid, executable, 'delete', item_id, details, decision,
                method, outcome, entry_tag, mac FROM audit WHERE seq = 8;
            """)
        #expect(try verify(dir3) == .broken(seq: 9, problem: .inserted))
    }

    @Test func deletedNewestEntriesAreNamed() throws {
        // Head left alone.
        let dir = try seeded(8)
        try raw(dir).exec("DELETE FROM audit WHERE seq >= 7")
        #expect(try verify(dir) == .broken(seq: 7, problem: .truncatedTail))

        // Head fixed up to the previous row's values (seq and mac; the tag cannot be forged).
        let dir2 = try seeded(8)
        try raw(dir2).exec("""
            DELETE FROM audit WHERE seq >= 7;
            UPDATE audit_head SET seq = 6, mac = (SELECT mac FROM audit WHERE seq = 6);
            """)
        #expect(try verify(dir2) == .broken(seq: 7, problem: .truncatedTail))

        // Head row removed too, or everything removed.
        let dir3 = try seeded(8)
        try raw(dir3).exec("DELETE FROM audit WHERE seq >= 5; DELETE FROM audit_head;")
        #expect(try verify(dir3) == .broken(seq: 5, problem: .truncatedTail))
        let dir4 = try seeded(8)
        try raw(dir4).exec("DELETE FROM audit; DELETE FROM audit_head;")
        #expect(try verify(dir4) == .broken(seq: 1, problem: .truncatedTail))
    }

    @Test func failedAuditWriteRollsBackTheChange() throws {
        let dir = TempDir()
        let store = try openStore(dir)
        _ = try store.add(owner: 1, NewItem(service: "s", account: "a"), secret: secret("x"), audit: record())
        store.close()
        // A real fault the store cannot avoid: a trigger makes every audit insert fail.
        try RawDatabase(dir.state + "/vault.db").exec("""
            CREATE TRIGGER audit_fault BEFORE INSERT ON audit BEGIN SELECT RAISE(ABORT, 'disk says no'); END;
            """)
        let faulty = try openStore(dir)
        #expect(throws: StoreError.auditWriteFailed) {
            try faulty.add(owner: 1, NewItem(service: "s", account: "b"), secret: secret("y"), audit: record())
        }
        #expect(try faulty.item(owner: 1, service: "s", account: "b") == nil)  // rolled back
        let existing = try #require(try faulty.item(owner: 1, service: "s", account: "a"))
        #expect(throws: StoreError.auditWriteFailed) { try faulty.delete(existing, audit: record(.delete)) }
        #expect(try faulty.item(owner: 1, service: "s", account: "a") != nil)
        #expect(throws: StoreError.auditWriteFailed) {
            try faulty.replace(existing, with: NewItem(service: "s", account: "a"), secret: secret("z"), audit: record(.update))
        }
        try expectSecret(string(faulty.openSecret(existing)), equals: "x")
        #expect(throws: StoreError.auditWriteFailed) { try faulty.append(record(.get)) }
        faulty.close()
        try RawDatabase(dir.state + "/vault.db").exec("DROP TRIGGER audit_fault")
        let healed = try openStore(dir)
        try healed.append(record(.get))
        #expect(try healed.verifyAudit() == .intact(count: 2))
    }
}

@Suite struct AuditPruneTests {
    @Test func pruneLeavesAVerifiableCheckpoint() throws {
        let dir = TempDir()
        let store = try openStore(dir)
        for i in 1...10 { try store.append(record(.get, service: "svc\(i)", account: "a")) }
        let exported = try store.auditEntries(visibleTo: nil, afterSeq: nil).filter { $0.seq <= 6 }
        #expect(exported.count == 6)
        #expect(throws: StoreError.notFound) { try store.pruneAudit(throughSeq: 99, audit: record(.auditPrune)) }
        #expect(try store.pruneAudit(throughSeq: 6, audit: record(.auditPrune)) == 6)
        #expect(try store.verifyAudit() == .intact(count: 5))  // 7...10 and the prune's own entry
        #expect(try store.auditEntries(visibleTo: nil).map(\.seq) == [7, 8, 9, 10, 11])
        try store.append(record(.list))
        store.close()
        #expect(try openStore(dir).verifyAudit() == .intact(count: 6))

        // The checkpoint is tagged: moving it (to hide more deletions) is detected.
        try RawDatabase(dir.state + "/vault.db").exec("DELETE FROM audit WHERE seq = 7; UPDATE audit_checkpoint SET seq = 7")
        #expect(try openStore(dir).verifyAudit() == .broken(seq: 8, problem: .altered))
        // Removing the checkpoint makes the first remaining entries look removed.
        try RawDatabase(dir.state + "/vault.db").exec("DELETE FROM audit_checkpoint")
        #expect(try openStore(dir).verifyAudit() == .broken(seq: 1, problem: .removed))
    }
}
