import Glibc
import KeyholdAuth
import KeyholdCore

/// The enrolled set a new `biometry-current-set` item is bound to (stored with the item,
/// authenticated with it, compared by `isInvalidated` at every release).
extension ReleaseGate {
    /// The binding to "no finger enrolled". All zeros: a real binding is the BLAKE2b-256 digest
    /// of the user's print files, and no set of files hashes to zeros, so this never matches an
    /// enrolment. Bound to it, the item's `biometry-current-set` half counts as invalidated
    /// now and after any later enrolment; only its other alternative opens it.
    static let emptyEnrolment = [UInt8](repeating: 0, count: BiometryDigest.byteCount)

    /// nil for a policy that binds nothing. With no finger enrolled, a policy that offers an
    /// alternative a person can satisfy without one (`biometry-current-set or device-passcode`,
    /// `… or user-presence`) is bound to the empty set, as the `or` promises; a policy that
    /// needs a finger (`biometry-current-set` alone, `… and …`, only biometric alternatives)
    /// is refused, as it could never be opened. No print store at all (fprintd was never
    /// installed) is no finger enrolled; a store that cannot be read otherwise refuses.
    func biometryBinding(for policy: Policy, user: String?) -> Result<[UInt8]?, Denial> {
        guard policy.bindsBiometrySet else { return .success(nil) }
        let state = domainState(user: user)
        if case .enrolled(_, let digest) = state { return .success(digest.bytes) }
        let noFinger = state == .noneEnrolled || (access(fprintStateDirectory, F_OK) != 0 && errno == ENOENT)
        if noFinger && policy.combinator == .or && policy.constraints.contains(where: { !$0.isBiometric }) {
            return .success(Self.emptyEnrolment)
        }
        return .failure(Denial(.authenticationFailed, "no finger is enrolled for this account"))
    }
}
