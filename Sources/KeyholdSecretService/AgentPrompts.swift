import CSystemd
import Glibc
import KeyholdCLI
import KeyholdClient
import KeyholdCore
import KeyholdProtocol

/// Answers the broker's authentication prompts during an unlock: `$KEYHOLD_ASKPASS` for a
/// password (as the CLI does), nothing else. Without it the prompt is canceled; a fingerprint
/// needs no answer (the broker's PAM conversation only shows notices).
final class AskpassInteraction: Interaction {
    func answer(_ prompt: KeyholdProtocol.Prompt) -> SecureBytes? {
        guard let p = getenv("KEYHOLD_ASKPASS"), p.pointee != 0 else { return nil }
        return Askpass.ask(String(cString: p), prompt: prompt.text)
    }

    func show(_ notice: Notice) {}
}

extension Agent {
    /// Unlock: items already readable are returned at once; the others wait for a Prompt.
    func unlock(_ paths: [String], _ c: Call) throws(BusError) {
        var unlocked: [String] = [], pending: [String] = []
        for path in paths {
            switch SecretObject.resolve(path) {
            case .service?, .collection?: unlocked.append(path)
            case .item(let id)?:
                guard let i = try? item(id) else { continue }
                if state.isLocked(i) { pending.append(id) } else { unlocked.append(path) }
            default: continue
            }
        }
        let prompt = pending.isEmpty ? "/" : try state.addPrompt(owner: c.sender, itemIDs: pending)
        try reply(c.m) { w in w.objectPaths(unlocked); w.objectPath(prompt) }
    }

    func promptMethod(_ path: String, _ c: Call) throws(BusError) {
        guard let entry = state.prompts[path], entry.owner == c.sender else { throw .noSuchObject }
        switch c.member {
        case "Prompt":
            try c.r.requireSignature("s")
            _ = try c.r.string()  // window id: there is no window to parent to
            state.prompts[path] = nil
            try reply(c.m) { _ in }
            _ = sd_bus_flush(bus)
            let pid = claimedPID(c.m)
            var done: [String] = []
            for id in entry.itemIDs {
                guard let i = try? item(id) else { continue }
                // The broker runs the item's policy; the secret it releases is dropped at once:
                // the unlock is the broker's reuse grant, not a copy held here.
                // The window is counted from before the broker's grant, so the agent never
                // calls an item unlocked that the broker would refuse (an IsLocked on read).
                let asked = AgentState.now()
                do throws(KeyholdError) {
                    let s = try vault.secret(service: i.service, account: i.account, claimedPID: pid,
                                             reason: "unlock", interaction: AskpassInteraction())
                    s.wipe()
                    let window = Int64(min(i.reuseSeconds, Limits.maxReuseSeconds))
                    state.unlockedUntil[id] = asked + window * 1_000_000
                    done.append(SecretObject.itemPath(id))
                } catch {
                    continue
                }
            }
            completed(path, dismissed: done.isEmpty, done)
            for p in done { if case .item(let id)? = SecretObject.resolve(p) { announceLocked(id, false) } }
        case "Dismiss":
            try c.r.requireSignature("")
            state.prompts[path] = nil
            try reply(c.m) { _ in }
            completed(path, dismissed: true, [])
        default:
            throw .unknownMethod("no method \(c.member) on a Prompt")
        }
    }

    func completed(_ path: String, dismissed: Bool, _ unlocked: [String]) {
        signal(path, Interface.prompt, "Completed") { w in
            w.bool(dismissed)
            w.variant("ao") { w.objectPaths(unlocked) }
        }
    }
}
