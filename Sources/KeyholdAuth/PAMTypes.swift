@_exported import KeyholdPAMWire
import KeyholdCore

/// Linux-PAM's return codes the broker reads from the helper's report (`<security/_pam_types.h>`,
/// a stable ABI). Written here so the broker does not link libpam: only keyhold-pam-helper
/// calls it. `PAMCodeTests` checks each against the header.
package enum PAMCode {
    package static let success: Int32 = 0
    package static let serviceError: Int32 = 3
    package static let systemError: Int32 = 4
    package static let permissionDenied: Int32 = 6
    package static let authError: Int32 = 7
    package static let credentialsInsufficient: Int32 = 8
    package static let authInfoUnavailable: Int32 = 9
    package static let userUnknown: Int32 = 10
    package static let maxTries: Int32 = 11
    package static let newAuthTokenRequired: Int32 = 12
    package static let accountExpired: Int32 = 13
    package static let authTokenError: Int32 = 20
    package static let authTokenExpired: Int32 = 27
    package static let badItem: Int32 = 29
}

/// What a PAM module says through the conversation, relayed to the caller.
public enum PAMMessage: Sendable, Equatable {
    case promptEchoOff(String)
    case promptEchoOn(String)
    case error(String)
    case info(String)

    public var isPrompt: Bool {
        switch self {
        case .promptEchoOff, .promptEchoOn: true
        case .error, .info: false
        }
    }
}

/// The caller's reply to a message. For info and error messages the answer is ignored, but
/// `.cancel` still ends the transaction.
public enum PAMAnswer: Sendable {
    case answer(SecureBytes)
    case cancel
}

/// How a transaction ended. Only `.success` authenticates; every other case is a denial.
public enum PAMResult: Sendable, Equatable {
    /// pam_authenticate and pam_acct_mgmt both succeeded. `answeredPrompt` is what the broker
    /// itself saw (an answer was given to a prompt): password rather than fingerprint.
    case success(answeredPrompt: Bool)
    /// Credentials were checked and rejected: PAM_AUTH_ERR, PAM_MAXTRIES (pam_fprintd: wrong
    /// finger), PAM_PERM_DENIED, PAM_USER_UNKNOWN, or an account error from pam_acct_mgmt.
    case failed(code: Int32)
    /// The stack could not do its work: PAM_AUTHINFO_UNAVAIL (no reader, no prints, remote
    /// session for pam_fprintd), a missing module or service file, a bad request.
    case unavailable(code: Int32)
    /// The conversation answered `.cancel`, or the interrupt fd fired.
    case canceled
    /// A prompt arrived while interaction was not allowed; it was never answered.
    case interactionNeeded
    /// The helper crashed, hung past the deadline, or broke the framing.
    case helperFailed
}

extension PAMResult {
    /// Classifies a non-zero return code of pam_authenticate or pam_acct_mgmt.
    package static func classify(_ code: Int32) -> PAMResult {
        switch code {
        case PAMCode.authError, PAMCode.permissionDenied, PAMCode.maxTries, PAMCode.userUnknown,
             PAMCode.credentialsInsufficient, PAMCode.accountExpired, PAMCode.newAuthTokenRequired,
             PAMCode.authTokenExpired, PAMCode.authTokenError:
            return .failed(code: code)
        default:
            return .unavailable(code: code)
        }
    }
}
