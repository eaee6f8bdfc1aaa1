import Glibc
import Synchronization
import CKeyholdOS
import KeyholdCore
import KeyholdProtocol
import KeyholdVault

/// Kept connections between requests. After its first request (on a thread of its own,
/// `Session.serve`), a kept connection waits here, in one `epoll` set, instead of holding a
/// thread asleep in `poll`; a few workers take each next request as it comes. A worker answers
/// only what cannot make it wait: a `get` wholly in the socket whose item the gate releases
/// without a conversation. Its release goes to the group commit without waiting
/// (`GroupCommit.submit`); the thread that commits it, or a worker it leaves the answer to,
/// sends the answer, and the connection waits here again. Everything else (a request not yet
/// wholly sent, any other operation, a prompt, an answer too large to send at once) goes to a
/// thread with `Session`'s deadlines, as before, and comes back here after. Measured with the
/// benchmark (docs/BENCHMARKS.md): no thread then sleeps between requests or waits for a commit.
///
/// A connection here keeps the rules of one waiting on a thread: its uid's slot, the 1 s it may
/// wait for a next request (a sweeper ends it), and `ConnectionSlots.makeRoom`, which ends its
/// wait with the same `KeptWait`.
final class EventLoop: Sendable {
    /// Measured against six: no difference; two cores, one worker leading a commit.
    static let workers = 3

    private let epoll: Int32
    /// Written when a finished leader leaves only submitted members queued (GroupCommit): a
    /// free worker then sends the answers that leader left, and leads them if it did not.
    private let leadWanted: Int32
    private let broker: Broker
    private let slots: ConnectionSlots
    private let threads: ParkedThreads
    private let held = Mutex<[UInt64: Held]>([:])
    private let nextID = Atomic<UInt64>(1)

    /// One connection here: its `KeptWait` is registered with `slots` for its whole life.
    private final class Held: @unchecked Sendable {
        let id: UInt64
        let fd: Int32
        let peer: Peer
        let kept: KeptWait
        /// When its current wait began (its `KeptWait` value); set before it is armed.
        var since: UInt64 = 0
        init(id: UInt64, fd: Int32, peer: Peer, kept: KeptWait) {
            self.id = id; self.fd = fd; self.peer = peer; self.kept = kept
        }
    }

    /// A closure for another thread (a worker's hand-off); what it captures is used there alone.
    private final class Handoff: @unchecked Sendable {
        let run: () -> Void
        init(_ run: @escaping () -> Void) { self.run = run }
    }

    init?(broker: Broker, slots: ConnectionSlots, threads: ParkedThreads) {
        let epoll = ckh_epoll_create()
        let leadWanted = ckh_eventfd_create()
        guard epoll >= 0, leadWanted >= 0, ckh_epoll_arm(epoll, leadWanted, 0, 0, 0) == 0 else {
            if epoll >= 0 { close(epoll) }
            if leadWanted >= 0 { close(leadWanted) }
            return nil
        }
        self.epoll = epoll
        self.leadWanted = leadWanted
        self.broker = broker
        self.slots = slots
        self.threads = threads
        for _ in 0..<Self.workers { DetachedThread.start { [self] in work() } }
        DetachedThread.start(stackBytes: 256 << 10) { [self] in sweep() }
        broker.group.handLeadTo { [leadWanted] in ckh_eventfd_signal(leadWanted) }
    }

    /// Takes a kept connection after a request was answered on `fd`; from here on this loop
    /// closes it (and gives back its slot). False, with nothing taken, when it cannot be armed.
    func adopt(fd: Int32, peer: Peer) -> Bool {
        let held = Held(id: nextID.wrappingAdd(1, ordering: .relaxed).oldValue, fd: fd, peer: peer,
                        kept: slots.keep(fd: fd, uid: peer.uid))
        self.held.withLock { $0[held.id] = held }
        guard wait(held, adding: true) else {
            self.held.withLock { $0[held.id] = nil }
            slots.forget(held.kept)
            return false
        }
        return true
    }

    /// Arms `held` for its next request (one-shot: one worker gets it).
    private func wait(_ held: Held, adding: Bool = false) -> Bool {
        held.since = held.kept.startWaiting()
        return ckh_epoll_arm(epoll, held.fd, adding ? 0 : 1, 1, held.id) == 0
    }

    private func work() {
        while true {
            var id: UInt64 = 0
            guard ckh_epoll_wait_one(epoll, &id) == 1 else { continue }
            if id == 0 {
                ckh_eventfd_drain(leadWanted)
                broker.group.runLeftCompletions()
                broker.group.leadIfQueued(withStore: { [broker] work in broker.withStore(work) })
                continue
            }
            guard let held = held.withLock({ $0[id] }) else { continue }
            next(held)
        }
    }

    /// The next request on `held`, which a worker was just given.
    private func next(_ held: Held) {
        if held.kept.stopWaiting(held.since) {
            // Ended to make room, or idle too long: a request already sent is answered *busy*.
            return onThread(held) { [self] in
                Session.answerBusyIfAsked(fd: held.fd)
                end(held)
            }
        }
        // Only a frame wholly in the socket is read here (no byte is taken otherwise): a worker
        // never waits for a client's bytes.
        var header: (UInt8, UInt8, UInt8, UInt8) = (0, 0, 0, 0)
        var reader = TimedFrameReader(fd: held.fd)
        let whole = withUnsafeMutableBytes(of: &header) { h in
            ckh_frame_waiting(held.fd, UInt32(Frame.maxPayloadBytes), h.baseAddress!.assumingMemoryBound(to: UInt8.self)) == 1
        }
        let payload: SecureBytes
        do throws(FrameError) {
            guard whole, let read = try reader.readWaiting(header: header, frameMilliseconds: Session.Deadlines.requestMilliseconds) else {
                return onThread(held) { [self] in
                    if Session.serveNext(fd: held.fd, peer: held.peer, broker: broker) { again(held) } else { end(held) }
                }
            }
            payload = read
        } catch {
            // Audited (a commit to wait for): on a thread.
            let unread = reader
            return onThread(held) { [self] in
                Session.reject(error, readBy: unread, fd: held.fd, peer: held.peer, broker: broker)
                end(held)
            }
        }
        let caller = Caller.identify(socket: held.fd, peer: held.peer, senders: reader.senders)
        let session = Session(fd: held.fd, caller: caller, broker: broker)
        let senderUIDs = reader.senders.map(\.uid)
        let request: Request, found: ReleaseRow
        switch session.forWorker(payload, senderUIDs: senderUIDs) {
        case nil:
            return onThread(held) { [self] in
                if session.run(payload, senderUIDs: senderUIDs, kept: true) { again(held) } else { end(held) }
            }
        case .refused(let busy)?:
            payload.wipe()
            return onThread(held) { [self] in
                session.send(.response(busy))
                end(held)
            }
        case .get(let r, let row)?:
            payload.wipe()
            (request, found) = (r, row)
        }
        session.getWithoutWaiting(request, found: found, offload: { [self] body in
            let handoff = Handoff(body)
            if !threads.run({ handoff.run() }) { body() }
        }, then: { [self] response in
            send(response, request: request, on: held)
        })
    }

    /// Sends `response` without waiting for the client: what does not fit in its socket is
    /// written by a thread, with the session's send deadline.
    private func send(_ response: Response, request: Request, on held: Held) {
        let framed = Frame.framed(BrokerMessage.response(response).encode())
        response.secret?.wipe()
        request.secret?.wipe()
        request.appPassword?.wipe()
        let keeps = response.outcome != .busy && request.operation.keepsConnection
        let sent = framed.withUnsafeBytes { ckh_send_nowait(held.fd, $0.baseAddress!, UInt($0.count)) }
        if sent == framed.count {
            framed.wipe()
            return keeps ? again(held) : end(held)
        }
        guard sent >= 0 || sent == -Int(EAGAIN) || sent == -Int(EWOULDBLOCK) else {
            framed.wipe()
            return end(held)
        }
        onThread(held) { [self] in
            let rest = framed.withUnsafeBytes { DescriptorIO.writeAll(held.fd, UnsafeRawBufferPointer(rebasing: $0[max(sent, 0)...]), socket: true) }
            framed.wipe()
            if rest == 0 && keeps { again(held) } else { end(held) }
        }
    }

    /// Runs `body` on a thread (it may wait); without one, the connection ends.
    private func onThread(_ held: Held, _ body: @escaping () -> Void) {
        let handoff = Handoff(body)
        if !threads.run({ handoff.run() }) { end(held) }
    }

    private func again(_ held: Held) {
        if !wait(held) { end(held) }
    }

    /// Closes `held` and gives back its slot. It leaves `held` first, so the sweeper never
    /// shuts a descriptor number that was closed, and `slots` before that, as `makeRoom` needs.
    private func end(_ held: Held) {
        slots.forget(held.kept)
        self.held.withLock { $0[held.id] = nil }
        _ = ckh_epoll_arm(epoll, held.fd, 2, 0, 0)
        held.peer.close()
        close(held.fd)
        slots.release(uid: held.peer.uid)
    }

    /// Ends the wait of every connection here that waited longer than a kept connection may
    /// (`Session.Deadlines.keepAliveMilliseconds`): its reading side is shut (under the lock
    /// `end` takes, so the descriptor is still this connection's), and a worker, woken by that,
    /// ends it. Four times a second.
    private func sweep() {
        let limit = UInt64(Session.Deadlines.keepAliveMilliseconds) * 1_000_000
        while true {
            usleep(250_000)
            let now = MonotonicClock.nanoseconds()
            held.withLock { all in
                for held in all.values {
                    guard let since = held.kept.waitingSince, now > since, now - since > limit,
                          held.kept.end(ifWaitingSince: since) else { continue }
                    shutdown(held.fd, Int32(SHUT_RD))
                }
            }
        }
    }
}
