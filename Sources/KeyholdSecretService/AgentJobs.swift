import CSystemd
import Glibc
import KeyholdClient
import KeyholdCore
import KeyholdProtocol

/// A method call whose reply comes later, from the loop: holds a reference to the message.
final class HeldCall {
    let m: OpaquePointer
    init(_ m: OpaquePointer) {
        self.m = m
        sd_bus_message_ref(m)
    }
    deinit { sd_bus_message_unref(m) }
}

/// A job thread's result on its way to the loop, which alone reads it.
struct JobResult: @unchecked Sendable {
    let job: Int
    let value: Any
}

/// Broker work off the event loop. Every request to the broker runs on a job's thread, so the
/// loop waits on nothing but the bus daemon: a broker that is slow or answers *busy* (retried
/// for seconds by the client library) delays only the client whose call it is. A client has
/// one job at a time; its next calls wait, in order, until that job's reply is sent
/// (`AgentState.maxQueuedPerClient`), so each client sees its calls take effect in the order
/// it made them.
extension Agent {
    /// Runs `work` on a thread, then `finish` with its result on the loop, which replies to `c`
    /// (an error `finish` throws is the reply).
    func offload<T>(_ c: Call, cancel: PromptCancel = PromptCancel(), _ work: @escaping @Sendable () -> T,
                    then finish: @escaping (T) throws(BusError) -> Void) throws(BusError) {
        let job = try state.addJob(AgentState.Job(owner: c.sender, call: HeldCall(c.m), cancel: cancel) { value throws(BusError) in
            try finish(value as! T)
        })
        let inbox = self.inbox
        guard DetachedThread.start({ inbox.post(.job(JobResult(job: job, value: work()))) }) else {
            state.jobs[job] = nil
            throw .failed("cannot start the work for this call")
        }
    }

    /// On the loop: a job's reply, then the client's next waiting calls.
    func finishJob(_ result: JobResult) {
        guard let job = state.jobs.removeValue(forKey: result.job) else { return }
        do throws(BusError) {
            try job.finish(result.value)
        } catch {
            replyError(job.call.m, error)
        }
        serveWaiting(job.owner)
    }

    /// The calls `client` sent while its job ran, in order, until one starts a job again.
    func serveWaiting(_ client: String) {
        while !state.hasJob(client), let next = state.nextWaiting(client) {
            do throws(BusError) {
                if try !handle(next.m, sender: client) {
                    replyError(next.m, .unknownMethod("no such method"))
                }
            } catch {
                replyError(next.m, error)
            }
        }
    }

    /// A call that needs the items listed first (`Agent.cachedItem`): listed off the loop,
    /// then handled again from the start.
    func afterListing(_ c: Call) throws(BusError) {
        let vault = self.vault, claim = c.claim
        try offload(c, { () -> Result<[ItemInfo], BusError> in
            Self.brokerResult { () throws(KeyholdError) in try vault.items(claimedPID: claim) }
        }) { (listed: Result<[ItemInfo], BusError>) throws(BusError) in
            self.applyListing(try listed.get())
            guard sd_bus_message_rewind(c.m, 1) >= 0 else { throw .failed("cannot read the call again") }
            // The listing is fresh now: an item missing from it is NoSuchObject, not another listing.
            if try !self.handle(c.m, sender: c.sender) { throw .unknownMethod("no method \(c.member)") }
        }
    }

    func replyError(_ m: OpaquePointer, _ e: BusError) {
        var error = sd_bus_error()
        _ = sd_bus_error_set(&error, e.name, e.message)
        _ = sd_bus_reply_method_error(m, &error)
        sd_bus_error_free(&error)
    }
}
