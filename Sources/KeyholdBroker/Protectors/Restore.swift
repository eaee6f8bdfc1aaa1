import Glibc
import KeyholdCore
import KeyholdVault

/// `keyholdd --restore FILE` (issue 39 item 3), broker stopped: a backup made by `keyhold
/// backup` becomes this machine's vault. The recovery key is read from stdin (a terminal
/// with echo off, or a pipe), never from argv. Order, so that a wrong key or a damaged file
/// creates nothing:
///   1. the backup read and opened with the recovery key (identity, wrap, check value, MAC);
///   2. only then a non-empty state directory moved aside (with `--accept-rollback` only);
///   3. `vault.db` written, the vault key protected by this machine's protector (the TPM
///      when there is one, as for a new vault);
///   4. one transaction: this machine's protector record, the old machine's counter value
///      dropped, the `restore` entry naming the backup;
///   5. the start checks run: the TPM counter is made from here, the anchor advanced.
/// A failure in 3-5 removes what 3 created.
enum VaultRestore {
    enum Failure: Error {
        case recovery(RecoveryError)
        case store(StoreError)
        case usage(String)

        var text: String {
            switch self {
            case .recovery(let e): e.description
            case .store(let e): e.description
            case .usage(let s): s
            }
        }

        var code: Int32 {
            switch self {
            case .recovery(let e): Int32(e.outcome.rawValue)
            case .store(let e): Int32(e.outcome.rawValue)
            case .usage: 2
            }
        }
    }

    static let maxBackupBytes = 4 << 30

    static func run(file: String, options: BrokerOptions, executable: String) throws(Failure) -> String {
        let image = try readBackup(file)
        let dir = options.stateDirectory
        let existing = try entries(dir)
        if !existing.isEmpty && !options.acceptRollback {
            throw .usage("\(dir) is not empty: a restore replaces a vault only with --accept-rollback (the old state is moved aside, and the decision audited)")
        }
        guard let recovery = readRecoveryKey() else { throw .recovery(.mistyped) }
        let opened: VaultBackup.Opened
        do throws(RecoveryError) { opened = try VaultBackup.open(image, recovery: recovery) } catch { throw .recovery(error) }

        var aside: String?
        if !existing.isEmpty {
            let moved = "\(dir).before-restore-\(currentMicroseconds() / 1_000_000)"
            guard rename(dir, moved) == 0 else { throw .store(.io(code: errno)) }
            aside = moved
        }
        let access: TPMAccess
        do throws(StoreError) { access = try TPMAccess.load(options) } catch { throw .store(error) }
        let kind: KeyProtectorKind = switch options.keyProtector {
        case .auto: access.configured ? .tpm : .file
        case .tpm: .tpm
        case .file: .file
        }
        do throws(StoreError) {
            try VaultBackup.writeDatabase(opened.database, stateDirectory: dir)
            let protector = KeyProtectorSetup.protector(kind, options, access)
            try KeyFiles.replace(dir + "/" + kind.fileName, with: try protector.protect(opened.vaultKey), directory: dir)
            let store = try VaultStore.open(stateDirectory: dir, keyProtector: KeyProtectorMigration.Loaded(kind: kind, key: opened.vaultKey))
            defer { store.close() }
            guard case .intact = try store.verifyAudit() else { throw StoreError.integrity }
            var reason = "backup=\(file) made=\(opened.madeAt) recovery-key=\(opened.identity) key-protector=\(kind.rawValue)"
            if let aside { reason += " accept-rollback previous-state=\(aside)" }
            let entry = AuditRecord(callerUID: geteuid(), callerPID: getpid(), executable: executable, operation: .restore,
                                    decision: .granted, reason: reason, outcome: .ok)
            try store.adoptRestored(ProtectorRecord(kind: kind, counterIndex: store.defaultCounterIndex, counter: kind == .tpm ? .pending : .none),
                                    audit: entry)
        } catch {
            removeCreated(dir)
            throw .store(error)
        }
        // The rollback baseline starts here: the TPM counter made (or adopted) for this vault
        // key, the anchor file advanced to this head. A refusal here ends the process.
        do throws(StoreError) {
            let vault = try KeyProtectorSetup.openVault(options, access)
            defer { vault.store.close() }
            _ = KeyProtectorStart.check(vault, options, access, executable: executable)
            options.rollbackAnchor.map(RollbackAnchor.init(path:))?.advance(vault.store)
        } catch { throw .store(error) }
        var text = "restored \(file) into \(dir) (key protector \(kind.rawValue))"
        if let aside { text += "; the previous state is in \(aside)" }
        return text
    }

    private static func readBackup(_ path: String) throws(Failure) -> [UInt8] {
        let fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC)
        guard fd >= 0 else { throw .usage("cannot open \(path) (errno \(errno))") }
        defer { close(fd) }
        var st = stat()
        guard fstat(fd, &st) == 0, st.st_mode & S_IFMT == S_IFREG else { throw .usage("\(path) is not a regular file") }
        guard st.st_size > 0, st.st_size <= maxBackupBytes else { throw .recovery(.notABackup) }
        // Read to EOF in blocks, within the size fstat gave (a file growing meanwhile is refused).
        var bytes: [UInt8] = []
        bytes.reserveCapacity(Int(st.st_size))
        var block = [UInt8](repeating: 0, count: 1 << 20)
        while true {
            let n = read(fd, &block, block.count)
            if n < 0 && errno == EINTR { continue }
            guard n >= 0 else { throw .usage("cannot read \(path) (errno \(errno))") }
            if n == 0 { break }
            guard bytes.count + n <= Int(st.st_size) else { throw .usage("\(path) changed while it was read") }
            bytes += block[0..<n]
        }
        return bytes
    }

    /// The names in the state directory; none when it does not exist yet.
    private static func entries(_ dir: String) throws(Failure) -> [String] {
        guard let d = opendir(dir) else {
            if errno == ENOENT { return [] }
            throw .store(.io(code: errno))
        }
        defer { closedir(d) }
        var names: [String] = []
        while let e = readdir(d) {
            let name = withUnsafeBytes(of: e.pointee.d_name) { String(cString: $0.bindMemory(to: CChar.self).baseAddress!) }
            if name != "." && name != ".." { names.append(name) }
        }
        return names
    }

    /// One line from stdin into guarded memory; echo off on a terminal.
    private static func readRecoveryKey() -> RecoveryKey? {
        let terminal = isatty(0) == 1
        var saved = termios()
        if terminal {
            _ = DescriptorIO.writeAll(2, "recovery key: ")
            tcgetattr(0, &saved)
            var quiet = saved
            quiet.c_lflag &= ~tcflag_t(ECHO)
            tcsetattr(0, TCSAFLUSH, &quiet)
        }
        defer {
            if terminal { tcsetattr(0, TCSAFLUSH, &saved); _ = DescriptorIO.writeAll(2, "\n") }
        }
        let line = SecureBytes(count: 256)
        let count = line.withUnsafeMutableBytes { buf -> Int in
            var n = 0
            while n < buf.count {
                var byte: UInt8 = 0
                let r = read(0, &byte, 1)
                if r < 0 && errno == EINTR { continue }
                if r <= 0 || byte == UInt8(ascii: "\n") { break }
                buf[n] = byte
                n += 1
            }
            return n
        }
        let typed = line.withUnsafeBytes { SecureBytes(copying: UnsafeRawBufferPointer(rebasing: $0[0..<count])) }
        return RecoveryKey(written: typed)
    }

    private static func removeCreated(_ dir: String) {
        for name in ["vault.db", "vault.db-wal", "vault.db-shm", KeyProtectorKind.file.fileName, KeyProtectorKind.tpm.fileName] {
            unlink(dir + "/" + name)
        }
    }
}
