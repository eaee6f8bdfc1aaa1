import Glibc
import KeyholdCore
import KeyholdProtocol
import KeyholdVault

/// `keyhold backup FILE` (issue 39 item 2), root only (refused by its row of the request table before this
/// runs). Audit, then act: the entry naming the file is committed first, so the snapshot
/// holds it and the chain of a restored vault says where it came from.
extension Session {
    func backup(_ request: Request) -> Response {
        var named = request
        guard let path = request.label, path.hasPrefix("/"), path.utf8.count <= 1024, !path.utf8.contains(0) else {
            return deny(request, .backup, item: nil, Denial(.usage, "backup needs an absolute file path"))
        }
        named.reason = "file=\(path)"
        // The file is made before the snapshot, so a path that cannot be created costs no copy.
        let fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            let why = errno == EEXIST ? "it exists (a backup never replaces a file)" : "errno \(errno)"
            return deny(named, .backup, item: nil, Denial(.otherError, "cannot create \(path): \(why)"))
        }
        var written = false
        defer {
            close(fd)
            if !written { unlink(path) }
        }
        guard fchmod(fd, 0o600) == 0 else { return deny(named, .backup, item: nil, Denial(.otherError, "cannot set the mode of \(path)")) }
        let refusal: RecoveryError? = broker.withStore { store in
            switch store.recoveryState() {
            case .present: nil
            case .none: .noRecoveryKey
            case .stale: .staleRecoveryKey
            }
        }
        if let refusal { return deny(named, .backup, item: nil, Denial(refusal.outcome, refusal.description)) }
        guard broker.audit(event(named, .backup, decision: .granted, outcome: .ok)) else { return Response(.auditUnavailable) }
        let image: Result<[UInt8], RecoveryError> = broker.withStore { store in
            do throws(RecoveryError) { return .success(try store.backupImage(madeAt: currentMicroseconds())) } catch { return .failure(error) }
        }
        switch image {
        case .failure(let e):
            broker.log("backup to \(path) failed: \(e)")
            return Response(e.outcome, detail: "backup failed: \(e)")
        case .success(let bytes):
            let rc = bytes.withUnsafeBytes { DescriptorIO.writeAll(fd, $0) }
            guard rc == 0, fsync(fd) == 0 else { return Response(.otherError, detail: "cannot write \(path) (errno \(rc == 0 ? errno : rc))") }
            written = true
            var r = Response(.ok)
            r.count = UInt64(bytes.count)
            return r
        }
    }
}
