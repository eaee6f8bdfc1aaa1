import CSystemd
import Glibc
import KeyholdCLI
import KeyholdClient
import KeyholdCore
import KeyholdProtocol

/// Answers the broker's authentication prompts during an unlock: `$KEYHOLD_ASKPASS` for a
/// password (as the CLI does), nothing else. Without it the prompt is canceled; a fingerprint
/// needs no answer (the broker's PAM conversation only shows notices). Once the prompt is
/// dismissed or its client left, every further question is canceled, and a finger wait ends.
final class AskpassInteraction: Interaction {
    let cancel: PromptCancel
    init(cancel: PromptCancel) { self.cancel = cancel }

    func answer(_ prompt: KeyholdProtocol.Prompt) -> SecureBytes? {
        guard !cancel.isCanceled, let p = getenv("KEYHOLD_ASKPASS"), p.pointee != 0 else { return nil }
        // Dismissed or abandoned while the askpass runs: it is killed, the broker told "canceled".
        return Askpass.ask(String(cString: p), prompt: prompt.text, canceled: { [cancel] in cancel.isCanceled })
    }

    func show(_ notice: Notice) {}

    /// Dismissed or abandoned while the broker waits for a finger: the broker ends that wait.
    var cancellation: (@Sendable () -> Bool)? { { [cancel] in cancel.isCanceled } }
}

/// One running prompt's work, done on its own thread: the broker runs each item's policy
/// (it may wait long on a finger or an askpass answer). Holds no bus object.
struct PromptJob: Sendable {
    struct Target: Sendable {
        let id: String
        let service: String
        let account: String
        let windowSeconds: Int64
    }

    let path: String
    let targets: [Target]
    let claimedPID: Int32
    let vault: Vault
    let cancel: PromptCancel

    /// How long a prompt waits while the broker is busy with another authentication of this
    /// user (one at a time per uid): as long as that one may take (the askpass limit), and no
    /// longer once the prompt is dismissed or its client leaves.
    static let busyWaitMilliseconds: Int64 = 130_000

    func run() -> PromptOutcome {
        var unlocked: [PromptOutcome.Unlock] = []
        let deadline = MonotonicClock.milliseconds() + Self.busyWaitMilliseconds
        for t in targets where !cancel.isCanceled {
            while !cancel.isCanceled {
                // The window counts from before the broker's grant, never past the broker's own.
                let asked = AgentState.now()
                do throws(KeyholdError) {
                    // The secret the broker releases is dropped at once: the unlock is the
                    // broker's reuse grant, not a copy held here.
                    let s = try vault.secret(service: t.service, account: t.account, claimedPID: claimedPID,
                                             reason: "unlock", interaction: AskpassInteraction(cancel: cancel))
                    s.wipe()
                    unlocked.append(PromptOutcome.Unlock(id: t.id, until: asked + t.windowSeconds * 1_000_000))
                } catch .busy where MonotonicClock.milliseconds() < deadline {
                    // Another prompt of this user is authenticating: queue behind it.
                    usleep(100_000)
                    continue
                } catch {}
                break
            }
        }
        return PromptOutcome(path: path, unlocked: unlocked)
    }
}

extension Agent {
    /// Unlock: items already readable are returned at once; the others wait for a Prompt.
    func unlock(_ paths: [String], _ c: Call) throws(BusError) {
        var unlocked: [String] = [], pending: [String] = []
        for path in paths {
            switch SecretObject.resolve(path) {
            case .service?, .collection?: unlocked.append(path)
            case .item(let id)?:
                guard let i = try cachedItem(id) else { continue }
                if state.isLocked(i, for: c.sender) { pending.append(id) } else { unlocked.append(path) }
            default: continue
            }
        }
        let (prompt, evicted) = pending.isEmpty ? ("/", nil) : try state.addPrompt(owner: c.sender, itemIDs: pending)
        try reply(c.m) { w in w.objectPaths(unlocked); w.objectPath(prompt) }
        // A prompt displaced by the fair share (AgentState) ends as dismissed, as if its client had.
        if let evicted { completed(evicted.path, dismissed: true, [], for: evicted.owner) }
    }

    func promptMethod(_ path: String, _ c: Call) throws(BusError) {
        let owner = state.prompts[path]?.owner ?? state.running[path]?.owner
        guard owner == c.sender else { throw .noSuchObject }
        switch c.member {
        case "Prompt":
            try c.r.requireSignature("s")
            _ = try c.r.string()  // window id: there is no window to parent to
            guard let entry = state.prompts[path] else { throw .failed("the prompt is already running") }
            guard state.running.count < AgentState.maxRunningPrompts,
                  state.running.values.filter({ $0.owner == c.sender }).count < AgentState.maxRunningPromptsPerClient else {
                throw .limitsExceeded("too many prompts running; call Prompt again when one has completed")
            }
            var targets: [PromptJob.Target] = []
            for id in entry.itemIDs {
                guard let i = try cachedItem(id) else { continue }
                targets.append(PromptJob.Target(id: id, service: i.service, account: i.account,
                                                windowSeconds: Int64(min(i.reuseSeconds, Limits.maxReuseSeconds))))
            }
            state.prompts[path] = nil
            // A reply that cannot be sent means the client is gone: nothing is started for it.
            guard (try? replyChecked(c.m)) == true else { return }
            let cancel = PromptCancel()
            let job = PromptJob(path: path, targets: targets, claimedPID: c.claim, vault: vault, cancel: cancel)
            state.running[path] = AgentState.RunningPrompt(owner: c.sender, cancel: cancel)
            let inbox = self.inbox
            guard DetachedThread.start({ inbox.post(.prompt(job.run())) }) else {
                state.running[path] = nil
                completed(path, dismissed: true, [], for: c.sender)
                return
            }
        case "Dismiss":
            try c.r.requireSignature("")
            state.prompts[path] = nil
            // A running prompt's thread stops asking; whatever it still gets from the broker is dropped.
            state.running.removeValue(forKey: path)?.cancel.cancel()
            try reply(c.m) { _ in }
            completed(path, dismissed: true, [], for: c.sender)
        default:
            throw .unknownMethod("no method \(c.member) on a Prompt")
        }
    }

    /// On the loop thread: a prompt thread's outcome becomes the unlock state and the signals.
    func finishPrompt(_ outcome: PromptOutcome) {
        // Dismissed, or its client left the bus: nothing of it is kept.
        guard let run = state.running.removeValue(forKey: outcome.path) else { return }
        for u in outcome.unlocked {
            let key = AgentState.Unlock(client: run.owner, id: u.id)
            state.unlockedUntil[key] = max(state.unlockedUntil[key] ?? 0, u.until)
        }
        completed(outcome.path, dismissed: outcome.unlocked.isEmpty, outcome.unlocked.map { SecretObject.itemPath($0.id) }, for: run.owner)
        // Unlocked for that client only (AgentState.Unlock).
        for u in outcome.unlocked { announceLocked(u.id, false, to: [run.owner]) }
    }

    func completed(_ path: String, dismissed: Bool, _ unlocked: [String], for client: String) {
        signal(path, Interface.prompt, "Completed", to: [client]) { w in
            w.bool(dismissed)
            w.variant("ao") { w.objectPaths(unlocked) }
        }
    }
}
