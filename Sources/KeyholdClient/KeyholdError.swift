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
    case notAuthorized
    case brokerUnavailable(String)
    case auditUnavailable
    case integrityFailure
    /// The item changed since it was read (exit code 14).
    case conflict
    /// The broker is at this uid's connection cap or audit budget (exit 15); retried ~3 s first.
    case busy
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
        case .notAuthorized: self = .notAuthorized
        case .brokerUnavailable: self = .brokerUnavailable(response.detail ?? "broker unavailable")
        case .auditUnavailable: self = .auditUnavailable
        case .integrityFailure: self = .integrityFailure
        case .conflict: self = .conflict
        case .busy: self = .busy
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
        default: outcome.description
        }
    }
}
