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
}

/// One connection to the broker, carrying one request and its conversation.
struct BrokerConnection {
    let fd: Int32

    init(socketPath: String) throws(KeyholdError) {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw .brokerUnavailable("cannot create a socket") }
        let rc = ckh_connect_unix(fd, socketPath)
        guard rc == 0 else {
            let e = errno
            _ = Glibc.close(fd)
            throw .brokerUnavailable("cannot connect to \(socketPath): \(String(cString: strerror(e)))")
        }
        self.fd = fd
    }

    func close() { _ = Glibc.close(fd) }

    func send(_ message: ClientMessage) throws(KeyholdError) {
        do throws(FrameError) {
            try Frame.write(message.encode(), to: fd)
        } catch {
            throw .brokerUnavailable("connection lost while sending")
        }
    }

    func receive() throws(KeyholdError) -> BrokerMessage {
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
                 onExportHeader: (AuditExportHeader) -> Void = { _ in }) throws(KeyholdError) -> Response {
        try send(.request(request))
        while true {
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
            case .response(let r):
                return r
            }
        }
    }
}
