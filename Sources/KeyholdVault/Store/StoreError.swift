import KeyholdCore

/// Every way a store call can fail. Closed; descriptions never contain a secret, a service or
/// an account name (a path is shown only for permission problems, so an admin can fix them).
public enum StoreError: Error, Equatable, Sendable, CustomStringConvertible {
    /// The database file is not SQLite, or is SQLite but not a Keyhold vault.
    case notAKeyholdDatabase
    /// The vault was written by a newer Keyhold (its schema version is above what this code knows).
    case unsupportedVersion(found: Int64, known: Int64)
    /// The state directory, key file or database is accessible to group/others, not owned by
    /// the broker's user, or not a plain directory/file.
    case insecurePermissions(path: String)
    /// The vault key file is unreadable, has the wrong size, or does not match the database.
    case keyFileInvalid
    /// A system or SQLite call failed (errno or SQLite extended result code).
    case io(code: Int32)
    /// An item with this owner, service and account exists.
    case duplicate
    case notFound
    /// A box failed to open under the vault key, or a row does not match what was asked for:
    /// the store was altered or damaged. Never the wrong item, never a crash.
    case integrity
    /// The item's policy includes `+app-password` and none was given.
    case appPasswordRequired
    /// The app password does not open the item key.
    case appPasswordWrong
    /// A secret above `Limits.maxSecretBytes`, or a text above `Limits.maxTextBytes`.
    case tooLarge
    /// The item is not storable as given (empty service or account, reuse window above the
    /// limit, too many executables, a biometry digest of the wrong size or missing for
    /// `biometry-current-set`, an app password without `+app-password`).
    case invalidItem
    /// An audit entry could not be written; the change it belonged to was rolled back.
    case auditWriteFailed
    /// The store was closed.
    case closed
    /// The item's generation changed since the caller read it (another change came first).
    case conflict
    /// The key protector (the TPM) could not give the vault key.
    case keyProtector(KeyProtectorFailure)

    /// What a caller sees.
    public var outcome: Outcome {
        switch self {
        case .notAKeyholdDatabase, .unsupportedVersion, .insecurePermissions, .keyFileInvalid, .io, .closed:
            .otherError
        case .duplicate: .duplicateItem
        case .notFound: .notFound
        case .integrity: .integrityFailure
        // The broker asks for the app password before opening; reaching the store without one
        // is a failed authentication from the caller's point of view.
        case .appPasswordRequired, .appPasswordWrong: .authenticationFailed
        case .tooLarge, .invalidItem: .usage
        case .auditWriteFailed: .auditUnavailable
        case .conflict: .conflict
        case .keyProtector(let f): f.outcome
        }
    }

    public var description: String {
        switch self {
        case .notAKeyholdDatabase: "the database file is not a Keyhold vault"
        case .unsupportedVersion(let found, let known): "the vault has schema version \(found); this Keyhold knows up to \(known)"
        case .insecurePermissions(let path): "refusing \(path): it must be owned by the broker's user and not accessible to group or others"
        case .keyFileInvalid: "the vault key file is unreadable, has the wrong size, or does not belong to this database"
        case .io(let code): "store I/O error (code \(code))"
        case .duplicate: "an item with this service and account already exists"
        case .notFound: "item not found"
        case .integrity: "integrity failure: the stored item was altered or damaged"
        case .appPasswordRequired: "this item needs its application password"
        case .appPasswordWrong: "the application password is wrong"
        case .tooLarge: "secret or text too large"
        case .invalidItem: "the item is not valid as given"
        case .auditWriteFailed: "the audit log could not be written; nothing was changed or released"
        case .closed: "the store is closed"
        case .conflict: "the item changed since it was read; nothing was changed"
        case .keyProtector(let f): f.description
        }
    }

    static func from(_ error: DatabaseError) -> StoreError {
        if error == .closed { return .closed }
        return error.isNotADatabase ? .notAKeyholdDatabase : .io(code: error.code)
    }
}
