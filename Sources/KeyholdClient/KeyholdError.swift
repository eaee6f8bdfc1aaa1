import KeyholdCore
import KeyholdProtocol

/// Every way a vault call can fail, one case per `Outcome`. Descriptions never
/// contain a secret; the broker's detail text is included only where it adds a non-secret fact.
public enum KeyholdError: Error, Equatable, CustomStringConvertible {
    case notFound
    case duplicateItem
    case userCanceled
    case authenticationFailed(String?)
    case interactionNotAllowed
    case invalidated
    case lockedOut(secondsLeft: UInt64?)
    /// With the broker's reason when it gives one (which rule refused: only root may prune the
    /// audit log; the program is not on the item's `--allow-exe` list; the sender is not the
    /// process that connected …).
    case notAuthorized(String? = nil)
    case brokerUnavailable(String)
    case auditUnavailable
    /// With the broker's detail when it has one (a vault seen rolled back while serving).
    case integrityFailure(String? = nil)
    /// The item changed since it was read (exit code 14), with the broker's account of how when
    /// it gives one (the generation the item is at; another rotation did not finish).
    case conflict(String? = nil)
    /// The broker is at this uid's connection cap or audit budget, or another authentication,
    /// verify or sealing of this user is in flight (exit 15), with which; retried ~3 s first.
    case busy(String? = nil)
    /// The request itself is wrong (too large, a bad policy): exit code 2.
    case invalidRequest(String)
    /// Anything else, including a broker that spoke garbage.
    case other(String)

    public var outcome: Outcome {
        switch self {
        case .notFound: .notFound
        case .duplicateItem: .duplicateItem
        case .userCanceled: .userCanceled
        case .authenticationFailed: .authenticationFailed
        case .interactionNotAllowed: .interactionNotAllowed
        case .invalidated: .invalidated
        case .lockedOut: .lockedOut
        case .notAuthorized: .notAuthorized
        case .brokerUnavailable: .brokerUnavailable
        case .auditUnavailable: .auditUnavailable
        case .integrityFailure: .integrityFailure
        case .conflict: .conflict
        case .busy: .busy
        case .invalidRequest: .usage
        case .other: .otherError
        }
    }

    init(_ response: Response) {
        switch response.outcome {
        case .notFound: self = .notFound
        case .duplicateItem: self = .duplicateItem
        case .userCanceled: self = .userCanceled
        case .authenticationFailed: self = .authenticationFailed(response.detail)
        case .interactionNotAllowed: self = .interactionNotAllowed
        case .invalidated: self = .invalidated
        case .lockedOut: self = .lockedOut(secondsLeft: response.secondsLeft)
        case .notAuthorized: self = .notAuthorized(response.detail)
        case .brokerUnavailable: self = .brokerUnavailable(response.detail ?? "broker unavailable")
        case .auditUnavailable: self = .auditUnavailable
        case .integrityFailure: self = .integrityFailure(response.detail)
        case .conflict: self = .conflict(response.detail)
        case .busy: self = .busy(response.detail)
        case .usage: self = .invalidRequest(response.detail ?? "invalid request")
        case .ok, .otherError: self = .other(response.detail ?? "error")
        }
    }

    public var description: String {
        switch self {
        case .authenticationFailed(let detail?): "\(Outcome.authenticationFailed.description): \(detail)"
        case .lockedOut(let s?): "\(Outcome.lockedOut.description); try again in \(s) s"
        case .brokerUnavailable(let why): "\(Outcome.brokerUnavailable.description): \(why)"
        case .invalidRequest(let why): why
        case .other(let why): why
        case .integrityFailure(let detail?): detail
        case .notAuthorized(let reason?): "not authorized: \(reason)"
        case .conflict(let how?): "conflict: \(how); nothing was changed"
        case .busy(let which?): "busy: \(which)"
        default: outcome.description
        }
    }
}
