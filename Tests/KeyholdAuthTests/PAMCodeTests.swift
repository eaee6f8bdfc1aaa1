import CPAM
import Testing
import KeyholdAuth

/// The broker reads PAM return codes without linking libpam (`PAMCode`): each value must be
/// Linux-PAM's own, from its header, or a rejected password could be taken for another outcome.
@Suite struct PAMCodeTests {
    @Test func codesMatchLinuxPAMsHeader() {
        let pairs: [(Int32, Int32)] = [
            (PAMCode.success, PAM_SUCCESS), (PAMCode.serviceError, PAM_SERVICE_ERR),
            (PAMCode.systemError, PAM_SYSTEM_ERR), (PAMCode.permissionDenied, PAM_PERM_DENIED),
            (PAMCode.authError, PAM_AUTH_ERR), (PAMCode.credentialsInsufficient, PAM_CRED_INSUFFICIENT),
            (PAMCode.authInfoUnavailable, PAM_AUTHINFO_UNAVAIL), (PAMCode.userUnknown, PAM_USER_UNKNOWN),
            (PAMCode.maxTries, PAM_MAXTRIES), (PAMCode.newAuthTokenRequired, PAM_NEW_AUTHTOK_REQD),
            (PAMCode.accountExpired, PAM_ACCT_EXPIRED), (PAMCode.authTokenError, PAM_AUTHTOK_ERR),
            (PAMCode.authTokenExpired, PAM_AUTHTOK_EXPIRED), (PAMCode.badItem, PAM_BAD_ITEM),
        ]
        for (ours, header) in pairs { #expect(ours == header) }
    }
}
