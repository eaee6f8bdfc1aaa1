/// Every result a caller can see, mirroring `errSec…` / `ASAuthorizationError` (README, "CLI contract").
///
/// The raw value is the `keyhold` CLI's exit code and the code on the wire, so the three can
/// never drift apart. Descriptions never contain a secret, a service or an account name.
public enum Outcome: UInt8, Sendable, CaseIterable, CustomStringConvertible {
    case ok = 0
    case otherError = 1
    case usage = 2
    case notFound = 3
    case duplicateItem = 4
    case userCanceled = 5
    case authenticationFailed = 6
    case interactionNotAllowed = 7
    case invalidated = 8
    case lockedOut = 9
    case notAuthorized = 10
    case brokerUnavailable = 11
    case auditUnavailable = 12
    case integrityFailure = 13
    /// The item changed (a newer generation) since the caller read it; read it again.
    case conflict = 14
    /// The caller's uid is at its connection cap or over its audit budget: try again shortly.
    case busy = 15

    /// Stable machine name, used in the audit log and `--json` output.
    public var name: String {
        switch self {
        case .ok: "ok"
        case .otherError: "error"
        case .usage: "usage"
        case .notFound: "not-found"
        case .duplicateItem: "duplicate-item"
        case .userCanceled: "user-canceled"
        case .authenticationFailed: "authentication-failed"
        case .interactionNotAllowed: "interaction-not-allowed"
        case .invalidated: "invalidated"
        case .lockedOut: "locked-out"
        case .notAuthorized: "not-authorized"
        case .brokerUnavailable: "broker-unavailable"
        case .auditUnavailable: "audit-unavailable"
        case .integrityFailure: "integrity-failure"
        case .conflict: "conflict"
        case .busy: "busy"
        }
    }

    public var description: String {
        switch self {
        case .ok: "ok"
        case .otherError: "error"
        case .usage: "usage error"
        case .notFound: "item not found"
        case .duplicateItem: "an item with this service and account already exists"
        case .userCanceled: "canceled by the user"
        case .authenticationFailed: "authentication failed"
        case .interactionNotAllowed: "interaction not allowed: this item needs authentication and no prompt may be shown"
        case .invalidated: "item invalidated: the enrolled fingerprints changed since it was stored"
        case .lockedOut: "locked out after too many failed authentications"
        case .notAuthorized: "not authorized: this item's policy does not allow this caller"
        case .brokerUnavailable: "the keyhold broker is not available"
        case .auditUnavailable: "the audit log could not be written; nothing was released"
        case .integrityFailure: "integrity failure: the stored item was altered or damaged"
        case .conflict: "conflict: the item changed since it was read; nothing was changed"
        case .busy: "busy: too many requests from this user at once; try again shortly"
        }
    }
}
