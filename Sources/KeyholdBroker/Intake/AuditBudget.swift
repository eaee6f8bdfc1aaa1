import Glibc
import Synchronization
import KeyholdCore
import KeyholdVault

/// How much one uid may add to the audit log per unit of time: a token bucket of bytes per
/// uid. A request that arrives while its uid's bucket is empty is not carried out: it is
/// answered *busy* and counted, and the counts are written as one `refused-burst` entry per
/// uid once its bucket has refilled. Every request that is carried out — every release among
/// them — gets its full entry, so growth per uid is at most the burst plus the rate times the
/// time, plus what the requests in flight when the bucket ran dry add (each at most one entry).
final class AuditBudget: Sendable {
    static let burstBytes = 1 << 20
    static let bytesPerSecond = 4096
    /// Fixed cost of an entry besides its texts: row, MACs, sealing, index (a generous estimate).
    static let entryOverheadBytes = 512

    private struct Bucket {
        var tokens: Double
        var stamp: Int64
        var refused: Int = 0
        var lastBurst: Int64 = 0
    }
    /// A uid still in debt gets its refused-burst entry at most this often.
    static let burstIntervalMicroseconds: Int64 = 10_000_000
    private let buckets = Mutex<[UInt32: Bucket]>([:])

    /// What an entry costs: its texts as stored (sealed: +40 bytes each) and the overhead.
    static func cost(_ record: AuditRecord) -> Int {
        let texts = [record.service, record.account, record.reason].reduce(0) { $0 + ($1.map { $0.utf8.count + 40 } ?? 0) }
        return entryOverheadBytes + record.executable.utf8.count + texts
    }

    private static func refill(_ b: inout Bucket, now: Int64) {
        let seconds = Double(max(0, now - b.stamp)) / 1_000_000
        b.tokens = min(Double(burstBytes), b.tokens + seconds * Double(bytesPerSecond))
        b.stamp = now
    }

    /// Root is not budgeted: it can fill the disk without the broker, it owns the vault, and its
    /// bulk work (imports, scripts) must not be refused.
    private func withBucket<R>(_ uid: UInt32, _ body: (inout Bucket) -> R) -> R? {
        guard uid != 0 else { return nil }
        let now = currentMicroseconds()
        return buckets.withLock { all in
            var b = all[uid] ?? Bucket(tokens: Double(Self.burstBytes), stamp: now)
            Self.refill(&b, now: now)
            let r = body(&b)
            all[uid] = b
            return r
        }
    }

    /// True when `uid` may have a request carried out (and so audited); otherwise the refusal
    /// is counted for its next `refused-burst` entry.
    func admit(uid: UInt32) -> Bool {
        withBucket(uid) { b in
            if b.tokens > 0 { return true }
            b.refused += 1
            return false
        } ?? true
    }

    /// Counts a request refused without an entry of its own (e.g. at the connection cap).
    func suppress(uid: UInt32) {
        withBucket(uid) { $0.refused += 1 }
    }

    func charge(uid: UInt32, bytes: Int) {
        withBucket(uid) { $0.tokens -= Double(bytes) }
    }

    /// Uids with refused requests whose bucket has refilled (or whose last burst entry is
    /// `burstIntervalMicroseconds` old; every one with `all`), and their counts (now cleared).
    /// Full buckets with nothing pending are forgotten.
    func takeBursts(all drain: Bool = false) -> [(uid: UInt32, count: Int)] {
        let now = currentMicroseconds()
        return buckets.withLock { all in
            var out: [(uid: UInt32, count: Int)] = []
            for (uid, var b) in all {
                Self.refill(&b, now: now)
                if b.refused > 0 && (drain || b.tokens > 0 || now - b.lastBurst >= Self.burstIntervalMicroseconds) {
                    out.append((uid, b.refused))
                    b.refused = 0
                    b.lastBurst = now
                }
                all[uid] = b.refused == 0 && b.tokens >= Double(Self.burstBytes) ? nil : b
            }
            return out
        }
    }

    /// Puts counts back after their entry could not be written.
    func restore(uid: UInt32, count: Int) {
        withBucket(uid) { $0.refused += count }
    }
}

/// The free space kept for the broker's own writes: item writes that would eat into it are
/// refused, so audit entries (of releases above all) can still be committed.
struct FreeSpaceReserve: Sendable {
    let directory: String
    let bytes: UInt64

    /// True when the file system of the state directory has less than the reserve left (or
    /// cannot say: fail closed).
    var isLow: Bool {
        var s = statvfs()
        guard statvfs(directory, &s) == 0 else { return true }
        return UInt64(s.f_bavail) * UInt64(s.f_frsize) < bytes
    }
}

extension Broker {
    /// Writes one `refused-burst` entry per uid whose refused requests were only counted.
    /// Runs on its own thread every second, and for every uid at shutdown; an entry that
    /// cannot be written keeps its count.
    func flushRefusedBursts(all: Bool = false) {
        for (uid, count) in budget.takeBursts(all: all) {
            let record = AuditRecord(callerUID: uid, callerPID: 0, executable: "", operation: .refusedBurst,
                                     decision: .denied, reason: "count=\(count)", outcome: .busy)
            if !audit(record) { budget.restore(uid: uid, count: count) }
        }
    }
}
