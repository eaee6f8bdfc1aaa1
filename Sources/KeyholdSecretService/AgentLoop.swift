import CKeyholdSS
import CSystemd
import Glibc
import Synchronization

/// What a prompt thread found: the items whose policy passed, each unlocked until `until`.
struct PromptOutcome: Sendable {
    struct Unlock: Sendable {
        let id: String
        let until: Int64
    }

    let path: String
    let unlocked: [Unlock]
}

/// What a thread hands back to the loop: a prompt's outcome, or a job's result.
enum LoopEvent: Sendable {
    case prompt(PromptOutcome)
    case job(JobResult)
}

/// Hands outcomes from prompt and job threads to the loop thread. sd-bus objects are not
/// thread-safe, so such a thread never touches the bus: it queues its outcome here and
/// wakes the loop through an eventfd the loop polls beside the bus's fd.
final class LoopInbox: Sendable {
    let fd: Int32
    private let outcomes = Mutex<[LoopEvent]>([])

    init?() {
        let fd = ckss_eventfd()
        guard fd >= 0 else { return nil }
        self.fd = fd
    }

    // Prompt threads hold the inbox until they have posted, so the fd outlives every writer.
    deinit { close(fd) }

    func post(_ outcome: LoopEvent) {
        outcomes.withLock { $0.append(outcome) }
        var one: UInt64 = 1
        _ = write(fd, &one, 8)
    }

    /// Everything posted so far (the eventfd is reset first, so a post racing this is seen
    /// on the next wake-up rather than lost).
    func take() -> [LoopEvent] {
        var count: UInt64 = 0
        _ = read(fd, &count, 8)
        return outcomes.withLock { queued in
            let out = queued
            queued = []
            return out
        }
    }
}

/// Set when a running prompt's client dismissed it or left the bus: its thread stops asking.
final class PromptCancel: Sendable {
    private let flag = Atomic<Bool>(false)
    func cancel() { flag.store(true, ordering: .relaxed) }
    var isCanceled: Bool { flag.load(ordering: .relaxed) }
}

extension Agent {
    /// The event loop. This thread alone owns the bus: it dispatches calls, applies prompt
    /// outcomes, and ends reuse windows. Serves until SIGTERM, the bus going away, or the name
    /// being lost.
    func serve(_ flags: LoopFlags) {
        let busFD = sd_bus_get_fd(bus)
        guard busFD >= 0 else { return }
        while ckss_terminated() == 0 && !flags.nameLost {
            for event in inbox.take() {
                switch event {
                case .prompt(let outcome): finishPrompt(outcome)
                case .job(let result): finishJob(result)
                }
            }
            expireLapsed(now: AgentState.now())
            let r = sd_bus_process(bus, nil)
            if r < 0 { break }  // the bus went away
            if r > 0 { continue }
            let events = sd_bus_get_events(bus)
            if events < 0 { break }
            var fds = [pollfd(fd: busFD, events: Int16(events), revents: 0),
                       pollfd(fd: inbox.fd, events: Int16(POLLIN), revents: 0)]
            if poll(&fds, 2, waitMilliseconds()) < 0 && errno != EINTR { break }
        }
    }

    /// Until the bus's own timeout, the earliest end of a reuse window, or a second at most
    /// (a SIGTERM handled on another thread does not interrupt this poll; it is seen within it).
    func waitMilliseconds() -> Int32 {
        let now = AgentState.now()
        var deadline = now + 1_000_000
        var busTimeout: UInt64 = 0
        if sd_bus_get_timeout(bus, &busTimeout) >= 0, busTimeout != UInt64.max {
            deadline = min(deadline, Int64(clamping: busTimeout))
        }
        if let lapse = state.unlockedUntil.values.min() { deadline = min(deadline, lapse) }
        return Int32(max(0, (deadline - now + 999) / 1000))
    }

    /// Items whose reuse window ended are locked again, and clients that cache `Locked` are told.
    func expireLapsed(now: Int64) {
        let lapsed = state.unlockedUntil.filter { $0.value <= now }.map(\.key)
        for unlock in lapsed {
            state.unlockedUntil[unlock] = nil
            announceLocked(unlock.id, true, to: [unlock.client])
        }
    }
}
