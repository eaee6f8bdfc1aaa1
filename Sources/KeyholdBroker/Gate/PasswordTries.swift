import KeyholdAuth
import KeyholdCore
import KeyholdProtocol
import KeyholdVault

/// Up to three tries of a mistyped password within one request, as sudo and gpg ask. After
/// the passcode stack rejects a password (PAM_AUTH_ERR, the answer to a hidden prompt), the
/// gate says "Sorry, try again.", asks again with the stack's own prompt, and only a
/// *different* answer is a new guess: it is counted for the lockout before PAM checks it, as
/// the first was (`AuthenticationAttempt.countAnother`), and PAM runs again with it. The same
/// answer again (a script's askpass replaying its one answer), a cancel, or a uid that the
/// count has just locked out ends the request with the failure it already had: no extra PAM
/// run, nothing more counted. The fingerprint stacks are never retried here (pam_fprintd has
/// its own `max-tries`; `user-presence` would wait for a finger again before the password).
final class PasswordTry {
    static let limit = 3

    /// What the last transaction asked and was told (a copy, wiped with this object).
    private(set) var prompt: String?
    private(set) var answered: SecureBytes?
    /// A retry's answer, asked by the gate before PAM ran again: given to PAM's first hidden prompt.
    private var prepared: SecureBytes?
    /// The last transaction ended in PAM_AUTH_ERR.
    var wrongPassword = false

    /// The answer to PAM's first hidden prompt of a transaction (the prepared one, or `ask()`),
    /// noted for the next comparison; later hidden prompts are relayed as they come.
    func answer(_ text: String, ask: () -> PAMAnswer) -> PAMAnswer {
        guard prompt == nil else { return ask() }
        prompt = text
        let reply: PAMAnswer
        if let ready = prepared {
            prepared = nil
            reply = .answer(ready)
        } else {
            reply = ask()
        }
        if case .answer(let bytes) = reply { answered = bytes.withUnsafeBytes { SecureBytes(copying: $0) } }
        return reply
    }

    /// Readies the next transaction with `next`, asked by the gate.
    func retry(with next: SecureBytes) {
        prompt = nil
        answered = nil
        wrongPassword = false
        prepared = next
    }
}

extension ReleaseGate {
    /// One stack, with the passcode stack's retries of a mistyped password (above).
    func runPAMWithRetries(_ stack: Stack, user: String, caller: Caller, attempt: AuthenticationAttempt,
                           via conversation: some Conversation) -> Result<AuthMethod.Factor, Denial> {
        guard stack == .passcode else { return runPAM(stack, user: user, caller: caller, via: conversation) }
        let password = PasswordTry()
        var tries = 1
        while true {
            let result = runPAM(stack, user: user, caller: caller, via: conversation, password: password)
            guard case .failure(let failed) = result, password.wrongPassword, tries < PasswordTry.limit,
                  let prompt = password.prompt, let wrong = password.answered else { return result }
            guard conversation.notify(.error, "Sorry, try again.") else { return .failure(failed) }
            guard case .answer(let next) = conversation.ask(Prompt(style: .echoOff, purpose: .authentication, text: prompt)) else {
                return .failure(failed)
            }
            if next.constantTimeEquals(wrong) {
                next.wipe()
                return .failure(failed)
            }
            if case .failure(let d) = attempt.countAnother(now: clock.microseconds()) {
                next.wipe()
                return .failure(d)
            }
            password.retry(with: next)
            tries += 1
        }
    }
}
