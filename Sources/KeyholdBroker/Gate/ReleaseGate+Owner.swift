import KeyholdAuth
import KeyholdCore
import KeyholdVault
import KeyholdProtocol

extension ReleaseGate {
    /// The caller's account password (stack `keyhold-passcode`), for removing an item whose own
    /// policy cannot be checked (it fails integrity, or it is invalidated). Never a reuse
    /// window; counted and limited like every attempt.
    func authorizeOwner(of ref: ItemReference, caller: Caller, request: Request, via conversation: some Conversation,
                        store: any LockoutStore) -> Result<AuthMethod, Denial> {
        switch lockoutLeft(uid: caller.uid, store: store) {
        case .failure(let d): return .failure(d)
        case .success(let left?): return .failure(Denial(.lockedOut, nil, secondsLeft: left))
        case .success(nil): break
        }
        guard request.allowInteraction else { return .failure(Denial(.interactionNotAllowed)) }
        guard let user = caller.userName else { return .failure(Denial(.authenticationFailed, "the caller's uid has no account")) }
        let attempt: AuthenticationAttempt
        switch attempts.reserve(uid: caller.uid, store: store, now: clock.microseconds()) {
        case .success(let a): attempt = a
        case .failure(let denial): return .failure(denial)
        }
        guard conversation.announce(announcement(caller, ref.service, ref.account, request)) else {
            return .failure(Denial(.userCanceled))
        }
        switch runPAM(.passcode, user: user, caller: caller, via: conversation) {
        case .failure(let d): return .failure(d)
        case .success:
            guard attempt.succeeded() else { return .failure(AuthenticationLedger.unrecorded) }
            return .success(AuthMethod.none.adding(.password))
        }
    }
}
