import Glibc
import KeyholdCore
import KeyholdProtocol
import CKeyholdOS

/// Answers the broker's prompts for one request: the CLI shows them on the terminal or runs
/// an askpass program; an app may show its own UI.
public protocol Interaction: AnyObject {
    /// The answer to a prompt, or nil when the person canceled.
    func answer(_ prompt: Prompt) -> SecureBytes?
    /// Shows an informational or error message from the authentication (e.g. "Swipe your finger").
    func show(_ notice: Notice)
    /// Whether the person has abandoned the request (a dismissed dialog), asked every
    /// `BrokerConnection.cancelPollMilliseconds` while the broker works with nothing to ask (a
    /// finger on the reader is awaited without a prompt): the broker is then told, and ends the
    /// wait at once (*user canceled*). nil (the default): never asked. The CLI needs none: a
    /// Ctrl-C ends its process, and so its connection, which the broker sees the same way.
    var cancellation: (@Sendable () -> Bool)? { get }
}

extension Interaction {
    public var cancellation: (@Sendable () -> Bool)? { nil }
}

/// One connection to the broker, carrying one request and its conversation. A *busy* answer
/// (this uid at its connection cap or audit budget) is retried on a new connection for up to
/// `busyRetrySeconds` before it is surfaced.
final class BrokerConnection {
    private(set) var fd: Int32
    let socketPath: String
    /// The request in progress was canceled while the broker worked on it.
    private(set) var canceledMidRequest = false
    static let busyRetrySeconds = 3.0
    static let cancelPollMilliseconds: Int32 = 100

    init(socketPath: String) throws(KeyholdError) {
        self.socketPath = socketPath
        fd = try Self.connect(socketPath)
    }

    private static func connect(_ socketPath: String) throws(KeyholdError) -> Int32 {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw .brokerUnavailable("cannot create a socket") }
        let rc = ckh_connect_unix(fd, socketPath)
        guard rc == 0 else {
            let e = errno
            _ = Glibc.close(fd)
            throw .brokerUnavailable("cannot connect to \(socketPath): \(String(cString: strerror(e)))")
        }
        return fd
    }

    func close() { _ = Glibc.close(fd) }

    /// Sleeps a little (growing, with jitter) and opens a new connection; false once the retry
    /// time is used up.
    private func reconnect(attempt: Int, started: UInt64) -> Bool {
        let elapsed = Double(MonotonicClock.nanoseconds() - started) / 1e9
        guard elapsed < Self.busyRetrySeconds else { return false }
        let base = min(10_000 << min(attempt, 5), 250_000)
        usleep(UInt32(base / 2 + Int.random(in: 0...base)))
        _ = Glibc.close(fd)
        guard let next = try? Self.connect(socketPath) else { fd = -1; return false }
        fd = next
        return true
    }

    func send(_ message: ClientMessage) throws(KeyholdError) {
        do throws(FrameError) {
            try Frame.write(message.encode(), to: fd)
        } catch {
            throw .brokerUnavailable("connection lost while sending")
        }
    }

    func receive() throws(KeyholdError) -> BrokerMessage {
        // Wait in poll, not in a blocking read: a thread blocked in a Unix socket's read is
        // woken by every event on the socket, including the broker reading our request (the
        // kernel's write-space wake-up), and would wake once for nothing per request; poll
        // wakes only for data, a hangup or an error. A failed poll leaves the read to block.
        _ = ckh_poll1(fd, Int32(POLLIN), -1)
        do throws(FrameError) {
            guard let payload = try Frame.read(from: fd) else { throw FrameError.truncated }
            return try BrokerMessage.decode(payload)
        } catch .truncated {
            throw .brokerUnavailable("the broker closed the connection")
        } catch .io {
            throw .brokerUnavailable("connection lost")
        } catch {
            throw .other("the broker sent a malformed reply (\(error))")
        }
    }

    /// Sends `request`, relays prompts and notices to `interaction`, collects list batches,
    /// and returns the final response. Without an interaction, a prompt is answered with cancel
    /// (the broker normally refuses earlier with interaction-not-allowed).
    func perform(_ request: Request, interaction: Interaction?,
                 onItems: ([ItemInfo]) -> Void = { _ in },
                 onAudit: ([AuditEntryInfo]) -> Bool = { _ in true },
                 onExportHeader: (AuditExportHeader) -> Void = { _ in },
                 onRotation: (SecureBytes, UInt64) -> ClientMessage = { _, _ in .cancel }) throws(KeyholdError) -> Response {
        let started = MonotonicClock.nanoseconds()
        var attempt = 0
        while true {
            let r = try performOnce(request, interaction: interaction, onItems: onItems, onAudit: onAudit,
                                    onExportHeader: onExportHeader, onRotation: onRotation)
            // Busy comes before anything else of the request happened: asking again is safe,
            // unless the request was abandoned meanwhile.
            guard r.outcome == .busy, !canceledMidRequest, reconnect(attempt: attempt, started: started) else { return r }
            attempt += 1
        }
    }

    private func performOnce(_ request: Request, interaction: Interaction?, onItems: ([ItemInfo]) -> Void,
                             onAudit: ([AuditEntryInfo]) -> Bool,
                             onExportHeader: (AuditExportHeader) -> Void,
                             onRotation: (SecureBytes, UInt64) -> ClientMessage) throws(KeyholdError) -> Response {
        canceledMidRequest = false
        do throws(KeyholdError) {
            try send(.request(request))
        } catch {
            // The broker may have answered *busy* and closed before reading: read that answer.
            if case .response(let r) = try? receive(), r.outcome == .busy { return r }
            throw error
        }
        while true {
            if !canceledMidRequest, let canceled = interaction?.cancellation, !waitForBroker(unless: canceled) {
                try send(.cancel)
                canceledMidRequest = true
            }
            switch try receive() {
            case .prompt(let p):
                if let answer = interaction?.answer(p) {
                    try send(.answer(answer))
                    answer.wipe()
                } else {
                    try send(.cancel)
                }
            case .notice(let n):
                interaction?.show(n)
            case .items(let items):
                onItems(items)
            case .auditEntries(let entries):
                if !onAudit(entries) { return Response(.ok) }
            case .auditExportHeader(let header):
                onExportHeader(header)
            case .rotationCurrent(let current, let generation):
                let reply = onRotation(current, generation)
                current.wipe()
                try send(reply)
            case .response(let r):
                return r
            }
        }
    }

    /// Waits until the broker has something to read (true) or `canceled` says so (false).
    private func waitForBroker(unless canceled: () -> Bool) -> Bool {
        while ckh_poll1(fd, Int32(POLLIN), Self.cancelPollMilliseconds) == 0 {
            if canceled() { return false }
        }
        return true  // readable, hung up or failed: `receive` says which
    }
}
