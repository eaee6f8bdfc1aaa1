/// Audit export that verifies on its own: each exported entry carries its readable fields AND
/// the exact row bytes its chain MAC covers, with its previous MAC; the export's header says
/// where the chain starts (genesis or a checkpoint) and where it ends, under a tag only the
/// broker's audit key can make. A verifier with that key checks the MACs, the links, the seqs,
/// the header's ends, and that every readable field is what the row decodes to, so editing any
/// human-readable field of a file is caught as surely as editing its MACs.

/// The readable fields of one entry, as an export shows them.
public struct AuditReadableFields: Sendable, Equatable {
    /// Microseconds since the epoch (UTC).
    public var time: Int64
    public var callerUID: UInt32
    public var callerPID: Int32
    public var executable: String
    public var operation: String
    /// 32 hex digits, as `ItemID.description`.
    public var itemID: String?
    public var service: String?
    public var account: String?
    public var decision: String
    public var method: String
    public var reason: String?
    public var outcome: String

    public init(time: Int64, callerUID: UInt32, callerPID: Int32, executable: String, operation: String,
                itemID: String?, service: String?, account: String?, decision: String, method: String,
                reason: String?, outcome: String) {
        self.time = time; self.callerUID = callerUID; self.callerPID = callerPID; self.executable = executable
        self.operation = operation; self.itemID = itemID; self.service = service; self.account = account
        self.decision = decision; self.method = method; self.reason = reason; self.outcome = outcome
    }
}

/// One exported entry.
public struct AuditExportRow: Sendable, Equatable {
    /// Largest canonical row: four texts of `Limits.maxTextBytes` (executable, and the three
    /// sealed names) plus fixed fields and box overhead stay well below this.
    public static let maxRowBytes = 24 * 1024
    public static let macBytes = 32

    public var seq: Int64
    public var readable: AuditReadableFields
    /// The canonical encoding of the stored row (fields after seq, the sealed details box
    /// included), exactly as the chain MAC covers it.
    public var row: [UInt8]
    public var previousMAC: [UInt8]
    public var mac: [UInt8]

    public init(seq: Int64, readable: AuditReadableFields, row: [UInt8], previousMAC: [UInt8], mac: [UInt8]) {
        self.seq = seq; self.readable = readable; self.row = row; self.previousMAC = previousMAC; self.mac = mac
    }
}

/// Where an export starts (the entry before its first: seq 0 and the genesis value, or the
/// checkpoint of an earlier prune) and ends, tagged under the audit key: deleting the last
/// rows of a file, or moving its ends, is detected.
public struct AuditExportHeader: Sendable, Equatable {
    public var startSeq: Int64
    public var startMAC: [UInt8]
    public var throughSeq: Int64
    public var throughMAC: [UInt8]
    public var tag: [UInt8]

    public init(startSeq: Int64, startMAC: [UInt8], throughSeq: Int64, throughMAC: [UInt8], tag: [UInt8]) {
        self.startSeq = startSeq; self.startMAC = startMAC; self.throughSeq = throughSeq
        self.throughMAC = throughMAC; self.tag = tag
    }

    /// How many entries the export holds.
    public var count: Int64 { throughSeq - startSeq }
}

public enum AuditExportProblem: String, Sendable, Equatable, CaseIterable {
    /// The header's ends or its tag were edited (reported with seq 0).
    case header
    /// The entry's row bytes, MAC or previous MAC do not chain.
    case altered
    /// A readable field differs from what the entry's row decodes to.
    case readableMismatch = "readable-mismatch"
    /// The entry with this seq is missing from the file.
    case removed
    /// The entry with this seq is in the file, but later than its place.
    case reordered
    /// A line that does not belong sits where this seq should be (a repeat, or beyond the end).
    case inserted
    /// The file ends before the header's last entry; this seq is the first missing.
    case truncated = "truncated-tail"
}

public enum AuditExportVerification: Sendable, Equatable {
    case intact(count: Int64)
    case broken(seq: Int64, problem: AuditExportProblem)
}
