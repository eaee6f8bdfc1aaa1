import Glibc
import Synchronization
import KeyholdCore
import KeyholdVault

/// `--rollback-anchor PATH`: the audit head's sequence number, also written to a file outside
/// the state directory after every store call that moved it. At start, a vault whose head is
/// behind the anchor was restored from an older copy: the broker refuses to serve until an
/// administrator starts it once with `--accept-rollback` (audited).
///
/// Catches restoring the state directory alone (a backup, a snapshot of one directory); NOT
/// restoring the whole disk, or anyone who can write the anchor's path too (an older anchor
/// file is accepted). Without a TPM this is the honest next-best; the TPM counter of issue 13
/// item 2 is meant to replace the file (same hook: `advance`).
final class RollbackAnchor: Sendable {
    let path: String
    /// The last sequence number written (only moves up). Touched under the store lock only.
    private let written = Mutex<Int64>(-1)

    init(path: String) { self.path = path }

    fileprivate func resetWritten() { written.withLock { $0 = -1 } }

    enum Verdict: Equatable {
        case fresh                        // no anchor yet: this start creates it
        case current(Int64)               // the head is at or past the anchor
        case rolledBack(head: Int64, anchor: Int64)
        case foreign                      // unreadable, malformed, or made for another vault
    }

    /// Compares the vault's authenticated head with the anchor file.
    func check(_ store: VaultStore) throws(StoreError) -> Verdict {
        let head = try store.authenticatedHeadSequence()
        let text: String
        do {
            let bytes = try KeyFiles.read(path, maxBytes: 256)
            text = bytes.withUnsafeBytes { String(decoding: $0, as: UTF8.self) }
        } catch {
            if case .keyFileInvalid = error, access(path, F_OK) != 0 { return .fresh }
            if case .insecurePermissions = error { throw error }
            return .foreign
        }
        guard let (seq, tag) = Self.parse(text), store.anchorTagMatches(seq: seq, tag: tag) else { return .foreign }
        return seq > head ? .rolledBack(head: head, anchor: seq) : .current(head)
    }

    /// `keyhold-anchor v1 SEQ TAGHEX\n`, exactly. The file is outside the state directory and
    /// may be written by others than the broker: parsed strictly, trusted only with its MAC.
    static func parse(_ text: String) -> (Int64, [UInt8])? {
        let parts = text.split(separator: " ", omittingEmptySubsequences: false)
        guard text.hasSuffix("\n"), parts.count == 4, parts[0] == "keyhold-anchor", parts[1] == "v1",
              let seq = Int64(parts[2]), seq >= 0, String(seq) == parts[2] else { return nil }
        let hex = Array(parts[3].dropLast().utf8)
        guard parts[3].last == "\n", hex.count == 64 else { return nil }
        var tag: [UInt8] = []
        for i in stride(from: 0, to: 64, by: 2) {
            guard let b = UInt8(String(decoding: hex[i..<i + 2], as: UTF8.self), radix: 16),
                  hex[i..<i + 2].allSatisfy({ ($0 >= 48 && $0 <= 57) || ($0 >= 97 && $0 <= 102) }) else { return nil }
            tag.append(b)
        }
        return (seq, tag)
    }

    /// Before every store access (RollbackWatch.swift): the vault's head must not be behind the
    /// last value this broker anchored. Compared with the broker's own memory of it, not the
    /// file: only this broker writes the anchor while it runs. nil when current.
    func watch(_ store: VaultStore) -> String? {
        let last = written.withLock { $0 }
        guard last >= 0 else { return nil }
        do throws(StoreError) {
            let head = try store.authenticatedHeadSequence()
            return head < last ? "its audit head is entry \(head), this broker last anchored entry \(last) in \(path)" : nil
        } catch {
            return error == .integrity ? "its audit head does not verify" : nil
        }
    }

    /// Writes the head's sequence number when it moved (temporary file, fsync, rename), so the
    /// anchor is never ahead of a committed head. Called after every store call, under its lock.
    func advance(_ store: VaultStore) {
        guard let seq = try? store.authenticatedHeadSequence() else { return }
        let should = written.withLock { $0 < seq }
        guard should else { return }
        let hex = store.anchorTag(seq: seq).map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined()
        let line = "keyhold-anchor v1 \(seq) \(hex)\n"
        let directory = String(path[..<(path.lastIndex(of: "/") ?? path.startIndex)])
        do {
            try KeyFiles.replace(path, with: SecureBytes(copying: Array(line.utf8)), directory: directory.isEmpty ? "/" : directory)
            written.withLock { $0 = max($0, seq) }
        } catch {
            // A failed anchor write leaves it behind (never ahead): the next write catches up.
        }
    }
}

/// The start-up decision on the anchor: serve, or refuse with *integrity* until an
/// administrator accepts the older copy.
enum RollbackAnchorStart {
    /// The accepted rollback's audit entry, if there was one (for its system-log copy).
    static func check(_ anchor: RollbackAnchor, _ store: VaultStore, _ options: BrokerOptions, executable: String) -> AuditRecord? {
        let verdict: RollbackAnchor.Verdict
        do throws(StoreError) { verdict = try anchor.check(store) } catch {
            BrokerMain.fail("cannot check the rollback anchor \(anchor.path): \(error)", code: Int32(error.outcome.rawValue))
        }
        let problem: String
        switch verdict {
        case .fresh, .current:
            anchor.advance(store)
            return nil
        case .rolledBack(let head, let anchored):
            problem = "integrity failure: the vault was restored from an older copy (its audit head is entry \(head), the rollback anchor \(anchor.path) records entry \(anchored))"
        case .foreign:
            // Re-keyed by --migrate-key-protector tpm and killed before the anchor was written
            // for the new audit key: the TPM counter made next takes over from the old anchor.
            if (try? store.protectorRecord())?.counter == .pending {
                anchor.reset()
                anchor.advance(store)
                return nil
            }
            problem = "integrity failure: the rollback anchor \(anchor.path) is unreadable, altered, or belongs to another vault"
        }
        guard options.acceptRollback else {
            BrokerMain.fail("\(problem); nothing is served. If this copy is what you want, start once with --accept-rollback (the decision is audited)",
                            code: Int32(Outcome.integrityFailure.rawValue))
        }
        let record = AuditRecord(callerUID: geteuid(), callerPID: getpid(), executable: executable, operation: .acceptRollback,
                                 decision: .granted, reason: String(describing: verdict), outcome: .ok)
        do throws(StoreError) { try store.append(record) } catch {
            BrokerMain.fail("cannot audit the accepted rollback: \(error)", code: Int32(Outcome.auditUnavailable.rawValue))
        }
        // Re-anchor at the accepted copy's head (the anchor is behind or foreign: overwrite).
        anchor.reset()
        anchor.advance(store)
        return record
    }
}

extension RollbackAnchor {
    /// Forgets the last written value, so the next `advance` writes even a lower head.
    func reset() { resetWritten() }
}
