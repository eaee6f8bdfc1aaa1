import Glibc
import KeyholdClient
import KeyholdCore

/// Ctrl-C during a prompt restores the terminal and exits *user canceled* (exit 5), for any
/// program that prompts through `PromptInteraction`.
public enum PromptSupport {
    public static func installInterruptHandler() { Terminal.installInterruptHandler() }
}

/// Prompts on the controlling terminal, or through `KEYHOLD_ASKPASS` when it is set (see
/// `Askpass`). Everything shown is escaped (`Output.announcement`, `Output.promptText`).
/// Public so the credential helpers prompt exactly as `keyhold` does.
public final class PromptInteraction: Interaction {
    let tty: Int32?
    let askpass: String?

    /// Nil when neither a terminal nor an askpass program is available: then no prompt can be
    /// shown and the broker answers *interaction not allowed*.
    /// `askpassVariables` are tried in order (git's helper adds `GIT_ASKPASS`); the first that
    /// is set and non-empty wins over the terminal.
    public init?(askpassVariables: [String] = ["KEYHOLD_ASKPASS"]) {
        if let a = askpassVariables.lazy.compactMap({ getenv($0) }).first(where: { $0.pointee != 0 }) {
            askpass = String(cString: a)
            tty = nil
        } else if let fd = Terminal.open() {
            askpass = nil
            tty = fd
        } else {
            return nil
        }
    }

    deinit {
        if let tty {
            Terminal.restore(tty)
            close(tty)
        }
    }

    public func answer(_ prompt: Prompt) -> SecureBytes? {
        let text = Output.promptText(prompt)
        if let askpass { return Askpass.ask(askpass, prompt: text) }
        guard let tty else { return nil }
        return Terminal.readLine(tty, prompt: text, echo: prompt.style == .echoOn)
    }

    public func show(_ notice: Notice) {
        guard let announcement = notice.announcement else {
            Terminal.write(tty ?? 2, Output.moduleText(notice.text))
            return
        }
        // A prompt follows the announce: echo goes off before it is drawn (and stays off until
        // this interaction ends), so type-ahead while the PAM helper starts is never shown.
        if let tty { Terminal.echoOff(tty) }
        Terminal.write(tty ?? 2, Output.announcement(announcement))
    }

    /// Asks twice (for a new secret or app password); nil on cancel, an error on mismatch. Echo
    /// stays off between the two entries too.
    func askTwice(_ text: String) -> Result<SecureBytes, KeyholdError> {
        let quiet = tty.map { Terminal.echoOff($0) } ?? false
        defer { if quiet, let tty { Terminal.restore(tty) } }
        guard let first = answer(Prompt(style: .echoOff, purpose: .appPassword, text: text)) else { return .failure(.userCanceled) }
        guard let second = answer(Prompt(style: .echoOff, purpose: .appPassword, text: "Again: ")) else {
            first.wipe()
            return .failure(.userCanceled)
        }
        defer { second.wipe() }
        guard first.constantTimeEquals(second) else {
            first.wipe()
            return .failure(.invalidRequest("the two entries differ"))
        }
        return .success(first)
    }
}
