import KeyholdAuth
import KeyholdCore
import KeyholdVault

extension ReleaseGate {
    /// The caller's account password (stack `keyhold-passcode`), for removing an item whose own
    /// policy cannot be checked (it fails integrity, or it is invalidated). Never a reuse
    /// window; counted and limited like every attempt.
    func authorizeOwner(caller: Caller, allowInteraction: Bool, lockout: LockoutRecord,
                        reserve: () -> Result<AuthenticationAttempt, Denial>,
                        interruptFD: Int32, announce: () -> Bool,
                        conversation: (PAMMessage) -> PAMAnswer) -> Result<AuthMethod, Denial> {
        if let left = Self.lockoutLeft(lockout, now: currentMicroseconds()) {
            return .failure(Denial(.lockedOut, nil, secondsLeft: left))
        }
        guard allowInteraction else { return .failure(Denial(.interactionNotAllowed)) }
        guard let user = caller.userName else { return .failure(Denial(.authenticationFailed, "the caller's uid has no account")) }
        let attempt: AuthenticationAttempt
        switch reserve() {
        case .success(let a): attempt = a
        case .failure(let denial): return .failure(denial)
        }
        guard announce() else { return .failure(Denial(.userCanceled)) }
        let request = PAMRequest(service: Stack.passcode.rawValue, user: user, ruser: user, tty: caller.tty, rhost: caller.remoteHost)
        switch authenticator.authenticate(request, allowInteraction: true, interruptFD: interruptFD, conversation: conversation) {
        case .success:
            guard attempt.succeeded() else { return .failure(AuthenticationLedger.unrecorded) }
            return .success(AuthMethod.none.adding(.password))
        case .failed: return .failure(Denial(.authenticationFailed))
        case .unavailable: return .failure(Denial(.authenticationFailed, "authentication is unavailable"))
        case .canceled: return .failure(Denial(.userCanceled))
        case .interactionNeeded: return .failure(Denial(.interactionNotAllowed))
        case .helperFailed: return .failure(Denial(.authenticationFailed, "authentication could not complete"))
        }
    }
}
