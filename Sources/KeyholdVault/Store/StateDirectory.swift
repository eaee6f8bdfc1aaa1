import Glibc
import KeyholdCore

/// File-system checks and creation for the state directory and the vault key file. Every
/// path is checked with lstat/O_NOFOLLOW (a symlink is refused, not followed), and every
/// file is created with O_EXCL and an explicit fchmod, so the umask never decides a mode and
/// an existing file is never overwritten.
enum StateDirectory {
    static let keyFileName = "vault.key"
    static let databaseFileName = "vault.db"

    /// Creates `path` 0700 if missing; refuses it if it exists and is not a directory owned by
    /// the euid with no group/other bits.
    static func prepare(_ path: String) throws(StoreError) {
        var st = stat()
        if lstat(path, &st) != 0 {
            guard errno == ENOENT else { throw .io(code: errno) }
            guard mkdir(path, 0o700) == 0 else { throw .io(code: errno) }
            guard chmod(path, 0o700) == 0, lstat(path, &st) == 0 else { throw .io(code: errno) }
        }
        try checkOwnedPrivate(st, path: path, type: S_IFDIR)
    }

    static func checkOwnedPrivate(_ st: stat, path: String, type: mode_t) throws(StoreError) {
        guard st.st_mode & S_IFMT == type, st.st_uid == geteuid(), st.st_mode & 0o077 == 0 else {
            throw .insecurePermissions(path: path)
        }
    }

    static func exists(_ path: String) throws(StoreError) -> Bool {
        var st = stat()
        if lstat(path, &st) == 0 { return true }
        guard errno == ENOENT else { throw .io(code: errno) }
        return false
    }

    /// Reads an existing key file: a regular file of exactly 32 bytes, owned by the euid,
    /// mode 0600 or stricter.
    static func readKey(_ path: String) throws(StoreError) -> VaultKey {
        let fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC)
        guard fd >= 0 else {
            if errno == ELOOP { throw .insecurePermissions(path: path) }
            throw .keyFileInvalid
        }
        defer { Glibc.close(fd) }
        var st = stat()
        guard fstat(fd, &st) == 0 else { throw .io(code: errno) }
        try checkOwnedPrivate(st, path: path, type: S_IFREG)
        guard st.st_size == VaultKey.byteCount else { throw .keyFileInvalid }
        let key = SecureBytes(count: VaultKey.byteCount)
        let ok = key.withUnsafeMutableBytes { buf -> Bool in
            var done = 0
            while done < buf.count {
                let n = read(fd, buf.baseAddress! + done, buf.count - done)
                if n < 0 && errno == EINTR { continue }
                guard n > 0 else { return false }
                done += n
            }
            // One more byte means the file grew since fstat.
            var extra: UInt8 = 0
            return read(fd, &extra, 1) == 0
        }
        guard ok else { throw .keyFileInvalid }
        do { return try VaultKey(bytes: key) } catch { throw .keyFileInvalid }
    }

    /// Writes a new key file with O_EXCL (never replaces one), 0600, fsynced with its directory.
    static func createKey(_ path: String, directory: String) throws(StoreError) -> VaultKey {
        let key = VaultKey.generate()
        let fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw .io(code: errno) }
        var failure: Int32 = 0
        if fchmod(fd, 0o600) != 0 { failure = errno }
        if failure == 0 {
            failure = key.withUnsafeBytes { DescriptorIO.writeAll(fd, $0) }
        }
        if failure == 0, fsync(fd) != 0 { failure = errno }
        Glibc.close(fd)
        guard failure == 0 else {
            // A partial key file would make the next start refuse; this one is ours, remove it.
            unlink(path)
            throw .io(code: failure)
        }
        syncDirectory(directory)
        return key
    }

    /// Creates an empty file 0600 with O_EXCL (the database, before SQLite opens it).
    static func createPrivateFile(_ path: String, directory: String) throws(StoreError) {
        let fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw .io(code: errno) }
        let rc = fchmod(fd, 0o600) == 0 ? 0 : errno
        Glibc.close(fd)
        guard rc == 0 else { throw .io(code: rc) }
        syncDirectory(directory)
    }

    /// A file's device and inode.
    public struct FileIdentity: Equatable, Sendable {
        let device: UInt64
        let inode: UInt64
    }

    static func identity(_ path: String) throws(StoreError) -> FileIdentity {
        var st = stat()
        guard lstat(path, &st) == 0 else { throw .io(code: errno) }
        return FileIdentity(device: UInt64(st.st_dev), inode: UInt64(st.st_ino))
    }

    /// Opens the database at `path` and says which file it is: the path must name the same file
    /// (device and inode) before and after SQLite opened it, and SQLite's descriptor must be the
    /// file at the path, else `.integrity` (the file was swapped while it was opened).
    static func openDatabase(_ path: String) throws(StoreError) -> (Database, FileIdentity) {
        let before = try identity(path)
        let db: Database
        do { db = try Database(path: path) } catch { throw StoreError.from(error) }
        guard !db.fileHasMoved, (try? identity(path)) == before else {
            db.close()
            throw .integrity
        }
        return (db, before)
    }

    /// The files SQLite opens by path for one database: itself, its WAL and its shared memory.
    static func databaseFiles(_ path: String) throws(StoreError) -> [FileIdentity] {
        [try identity(path), try identity(path + "-wal"), try identity(path + "-shm")]
    }

    /// The files `db` (opened at `path` as `opened`) has open now, once it has read: what a
    /// reader must find at these paths. `.integrity` if the database is no longer the one at its path.
    static func openedFiles(_ db: Database, at path: String, opened: FileIdentity) throws(StoreError) -> [FileIdentity] {
        let files = try databaseFiles(path)
        guard !db.fileHasMoved, files[0] == opened else { throw .integrity }
        return files
    }

    /// Opens `path` read-only as another connection to the writer's files (`expecting`, from
    /// `openedFiles`): the database, WAL and shared-memory paths must name those files before
    /// SQLite opens the database and after its first read (which opens the WAL and the shared
    /// memory, by path), and SQLite's descriptor must be the file at the path; else `.integrity`.
    static func openReader(_ path: String, expecting: [FileIdentity]) throws(StoreError) -> Database {
        guard try databaseFiles(path) == expecting else { throw .integrity }
        let db: Database
        do {
            db = try Database(path: path, readOnly: true)
            _ = try db.pragma("schema_version")
        } catch { throw StoreError.from(error) }
        guard !db.fileHasMoved, (try? databaseFiles(path)) == expecting else {
            db.close()
            throw .integrity
        }
        return db
    }

    static func checkExistingFile(_ path: String) throws(StoreError) {
        var st = stat()
        guard lstat(path, &st) == 0 else { throw .io(code: errno) }
        try checkOwnedPrivate(st, path: path, type: S_IFREG)
    }

    static func syncDirectory(_ path: String) {
        let fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if fd >= 0 { fsync(fd); Glibc.close(fd) }
    }
}

