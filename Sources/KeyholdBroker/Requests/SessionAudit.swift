import Glibc
import KeyholdAuth
import KeyholdCore
import KeyholdVault
import KeyholdProtocol

/// The audit operations of a session: query, verify, prune, export and export verification.
extension Session {
    /// Audit entries the caller may see: their own requests (root: all). With `follow`, keeps
    /// sending new entries until the caller goes away.
    func auditQuery(_ request: Request) -> Response {
        // The query's own entry names no item: a filter is not an access to the item.
        var unfiltered = request
        unfiltered.item = nil
        guard broker.audit(event(unfiltered, .auditRead, decision: .granted, outcome: .ok)) else { return Response(.auditUnavailable) }
        let visibleTo: UInt32? = caller.uid == 0 ? nil : caller.uid
        let filter = request.item.map { (service: $0.service, account: $0.account) }
        var afterSeq = request.afterSeq
        // A user numbers entries among their own (see auditEntries): resume after their own number.
        if let uid = visibleTo, let own = request.afterSeq {
            let translated = broker.longRead { (source) throws(StoreError) in try source.auditSeq(uid: uid, own: own) }
            guard case .success(let seq) = translated else { return Response(.auditUnavailable, detail: "the audit log could not be read") }
            afterSeq = seq
        }
        var sent = 0
        // A user's own number of the last entry sent: later pages and polls number on from it.
        var ownAfter: Int64?
        while true {
            let page = broker.longRead { [afterSeq, ownAfter] (source) throws(StoreError) in
                try source.auditEntries(visibleTo: visibleTo, since: request.since, item: filter, afterSeq: afterSeq,
                                        ownAfter: ownAfter, limit: 5000)
            }
            guard case .success(let views) = page else { return Response(.auditUnavailable, detail: "the audit log could not be read") }
            var infos: [AuditEntryInfo] = []
            var reachedUntil = false
            for v in views {
                if let until = request.until, v.readable.time > until { reachedUntil = true; break }
                // Only root sees the log's own numbering and MACs; a user, their own numbers.
                infos.append(AuditEntryInfo(seq: v.ownSeq ?? v.seq, readable: v.readable,
                                            mac: visibleTo == nil ? Hex.encode(v.mac) : "", previousMAC: ""))
            }
            for batch in BrokerMessage.auditBatches(infos) {
                guard send(batch) else { return Response(.ok) }
            }
            sent += infos.count
            if let last = views.last { afterSeq = last.seq; ownAfter = last.ownSeq }
            if reachedUntil { break }
            if views.count == 5000 { continue }
            guard request.follow else { break }
            // Following: wait for new entries, or for the caller to leave (readable = EOF/cancel).
            var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            if poll(&pfd, 1, 250) != 0 { return Response(.ok) }
        }
        var r = Response(.ok)
        r.count = UInt64(sent)
        return r
    }

    /// Checks the whole chain. Root is told how many entries and where it breaks; a user is
    /// told about their own entries only (how many, and where only if the first bad entry is
    /// theirs), so verifying reveals nothing of others' activity.
    func auditVerify(_ request: Request) -> Response {
        let visibleTo: UInt32? = caller.uid == 0 ? nil : caller.uid
        var r: Response
        // On the long-read reader, one per uid at a time (busy beyond: audited as any denial), so
        // one user's verifies cannot queue ahead of every other user's long reads.
        guard broker.verifying.reserve(caller.uid) else {
            return deny(request, .auditVerify, item: nil, Denial(.busy, "another audit verify of this user is in flight; try again when it ends"))
        }
        defer { broker.verifying.release(caller.uid) }
        switch broker.longRead({ (source) throws(StoreError) in try source.verifyAudit(visibleTo: visibleTo) }) {
        case .failure(let d): return deny(request, .auditVerify, item: nil, d)
        case .success(let answer):
            switch answer.verification {
            case .intact:
                r = Response(.ok)
                r.count = UInt64(answer.count)
            case .broken(_, let problem):
                r = Response(.integrityFailure, detail: problem.rawValue)
                r.firstBadSeq = answer.firstBad.map { UInt64(max($0, 0)) }
            }
        }
        // Recorded after the check, so the entry itself is not part of what was verified.
        guard broker.audit(event(request, .auditVerify, decision: .granted, outcome: r.outcome)) else { return Response(.auditUnavailable) }
        return r
    }

    /// Removes entries up to a time, leaving a checkpoint. Root only (the request table): the
    /// log is everyone's.
    func auditPrune(_ request: Request) -> Response {
        guard let until = request.until else { return deny(request, .auditPrune, item: nil, Denial(.usage, "prune needs --until")) }
        let record = event(request, .auditPrune, decision: .granted, outcome: .ok).record()
        // Audit, then act, like every other operation: nothing to prune is still one entry.
        let result = broker.transact(record) { (store) throws(StoreError) -> Int64 in
            guard let seq = try store.lastAuditSeq(atOrBefore: until) else {
                try store.append(record)
                return 0
            }
            return try store.pruneAudit(throughSeq: seq, audit: record)
        }
        switch result {
        case .success(let n):
            var r = Response(.ok)
            r.count = UInt64(n)
            return r
        case .failure(.auditWriteFailed): return Response(.auditUnavailable)
        case .failure(let e): return deny(request, .auditPrune, item: nil, Denial(e.outcome))
        }
    }

    /// An export that verifies on its own: its header, then every entry from the chain's start
    /// (genesis or the checkpoint) through the newest at or before `until`, each with its row
    /// bytes and MACs. Root only (the request table): the rows carry every user's entries.
    func auditExport(_ request: Request) -> Response {
        // The range is fixed before this request's own entry is written, so that entry is not
        // part of the export (it follows it in the chain).
        let prepared: Result<AuditExportHeader, Denial> = broker.withStore { store in
            do throws(StoreError) {
                let through = try store.lastAuditSeq(atOrBefore: request.until ?? Int64.max)
                return .success(try store.auditExportHeader(throughSeq: through))
            } catch {
                return .failure(Denial(error.outcome, error == .integrity ? "the audit checkpoint is damaged; run audit verify" : nil))
            }
        }
        let header: AuditExportHeader
        switch prepared {
        case .failure(let d): return deny(request, .auditExport, item: nil, d)
        case .success(let h): header = h
        }
        guard broker.audit(event(request, .auditExport, decision: .granted, outcome: .ok)) else { return Response(.auditUnavailable) }
        guard send(.auditExportHeader(header)) else { return Response(.otherError) }
        var cursor = (seq: header.startSeq, mac: header.startMAC)
        var sent: UInt64 = 0
        while cursor.seq < header.throughSeq {
            let after = cursor
            let page: Result<[AuditExportRow], StoreError> = broker.withStore { store in
                do throws(StoreError) {
                    return .success(try store.auditExportRows(after: after.seq, previousMAC: after.mac, through: header.throughSeq,
                                                              limit: 2000))
                } catch {
                    return .failure(error)
                }
            }
            switch page {
            case .failure(.integrity), .success([]):
                // Rows are checked against the chain as they are read: no export is vouched for past damage.
                broker.log("audit export stopped: the chain does not verify past entry \(after.seq)")
                return Response(.integrityFailure, detail: "the audit chain does not verify after entry \(after.seq); run audit verify")
            case .failure(let e):
                return Response(e.outcome, detail: "the audit log could not be read")
            case .success(let rows):
                for batch in BrokerMessage.auditBatches(rows.map { AuditEntryInfo($0) }) {
                    guard send(batch) else { return Response(.otherError) }
                }
                sent += UInt64(rows.count)
                cursor = (rows[rows.count - 1].seq, rows[rows.count - 1].mac)
            }
        }
        var r = Response(.ok)
        r.count = sent
        return r
    }

    /// Checks an exported file streamed by the caller (header in the request, then row batches,
    /// then an end marker) with the audit key. Anyone may ask: the answer is only a count or
    /// the first bad seq, and the rows come from the caller.
    func auditVerifyExport(_ request: Request) -> Response {
        guard let header = request.exportHeader else {
            return deny(request, .auditVerify, item: nil, Denial(.usage, "export verification needs its header"))
        }
        var verifier = broker.withStore { $0.auditExportVerifier(header) }
        reading: while true {
            let message: ClientMessage
            do throws(FrameError) {
                var reader = TimedFrameReader(fd: fd)
                guard let payload = try reader.read(idleMilliseconds: Deadlines.idleMilliseconds,
                                                    frameMilliseconds: Deadlines.frameMilliseconds) else {
                    return deny(request, .auditVerify, item: nil, Denial(.usage, "the export ended before its end marker"))
                }
                defer { payload.wipe() }
                message = try ClientMessage.decode(payload)
            } catch {
                return deny(request, .auditVerify, item: nil, Denial(.usage, "rejected export rows: \(error)"))
            }
            switch message {
            case .auditRows(let rows):
                // Decoding guarantees each row is complete; after the first bad one the verifier
                // only looks at seqs, so a long tail costs little.
                for info in rows { if let row = info.exportRow { verifier.add(row) } }
            case .auditRowsEnd:
                break reading
            default:
                return deny(request, .auditVerify, item: nil, Denial(.usage, "unexpected message in an export verification"))
            }
        }
        var r: Response
        switch verifier.finish() {
        case .intact(let count):
            r = Response(.ok)
            r.count = UInt64(count)
        case .broken(let seq, let problem):
            r = Response(.integrityFailure, detail: problem.rawValue)
            r.firstBadSeq = UInt64(max(seq, 0))
        }
        guard broker.audit(event(request, .auditVerify, decision: .granted, outcome: r.outcome)) else { return Response(.auditUnavailable) }
        return r
    }
}
