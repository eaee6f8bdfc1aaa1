import Glibc
import KeyholdCore

/// The framing between the broker and its PAM helper (KeyholdAuth on the broker's side,
/// KeyholdPAMHelper on the helper's).
///
/// Each frame is `kind (1 byte) ‖ payload length (4 bytes, big-endian) ‖ payload`. Both sides
/// parse strictly: an unknown kind, a length over the kind's cap, or a payload that does not
/// decode exactly is a broken peer. The helper runs third-party PAM modules, so the broker
/// treats everything it sends as hostile.
package enum PAMFrameKind: UInt8 {
    // broker → helper
    case request = 0x01
    case answer = 0x02
    case cancel = 0x03
    // helper → broker
    case message = 0x10
    case done = 0x11

    /// Largest payload accepted for the kind.
    package var maxPayload: Int {
        switch self {
        case .request: 6 * (2 + PAMRequestRules.maxFieldBytes) + 8
        case .answer: PAMRequestRules.maxConversationAnswerBytes
        case .cancel: 0
        case .message: 1 + PAMRequestRules.maxMessageBytes
        case .done: 5
        }
    }
}

package enum PAMFrame {
    /// The helper's end of its socketpair with the broker (the only descriptor it talks on).
    package static let helperChannel: Int32 = 3
    package static let headerBytes = 5
    package static let maxPayload = 6 * (2 + PAMRequestRules.maxFieldBytes) + 8

    package static func header(_ kind: PAMFrameKind, _ count: Int) -> [UInt8] {
        let n = UInt32(count)
        return [kind.rawValue, UInt8(n >> 24), UInt8((n >> 16) & 0xFF), UInt8((n >> 8) & 0xFF), UInt8(n & 0xFF)]
    }

    /// Parses a header; nil if the kind is unknown or the length exceeds its cap.
    package static func parseHeader(_ h: ArraySlice<UInt8>) -> (PAMFrameKind, Int)? {
        guard h.count >= headerBytes, let kind = PAMFrameKind(rawValue: h[h.startIndex]) else { return nil }
        let s = h.startIndex
        let n = Int(h[s + 1]) << 24 | Int(h[s + 2]) << 16 | Int(h[s + 3]) << 8 | Int(h[s + 4])
        guard n <= kind.maxPayload else { return nil }
        return (kind, n)
    }

    // MARK: message style codes on the wire
    package static let styleEchoOff: UInt8 = 1
    package static let styleEchoOn: UInt8 = 2
    package static let styleError: UInt8 = 3
    package static let styleInfo: UInt8 = 4

    // MARK: done stages
    package static let stageStart: UInt8 = 0
    package static let stageAuthenticate: UInt8 = 1
    package static let stageAccount: UInt8 = 2
    package static let stageSuccess: UInt8 = 3
}

/// What the broker sends the helper first: the request plus the service directory.
package struct PAMWireRequest: Equatable {
    package var request: PAMRequest
    package var serviceDirectory: String?
    package var deadlineSeconds: UInt32

    package init(request: PAMRequest, serviceDirectory: String?, deadlineSeconds: UInt32) {
        self.request = request
        self.serviceDirectory = serviceDirectory
        self.deadlineSeconds = deadlineSeconds
    }

    package func encode() -> [UInt8] {
        var out: [UInt8] = [1]  // format version
        let d = deadlineSeconds
        out += [UInt8(d >> 24), UInt8((d >> 16) & 0xFF), UInt8((d >> 8) & 0xFF), UInt8(d & 0xFF)]
        for field in [request.service, request.user, request.ruser, request.tty, request.rhost, serviceDirectory] {
            if let f = field {
                let u = Array(f.utf8)
                out += [UInt8(u.count >> 8), UInt8(u.count & 0xFF)] + u
            } else {
                out += [0xFF, 0xFF]
            }
        }
        return out
    }

    /// Strict decode: version 1, six fields, nothing left over, each field valid.
    package static func decode(_ p: [UInt8]) -> PAMWireRequest? {
        guard p.count >= 5, p[0] == 1 else { return nil }
        let deadline = UInt32(p[1]) << 24 | UInt32(p[2]) << 16 | UInt32(p[3]) << 8 | UInt32(p[4])
        var i = 5
        var fields: [String?] = []
        for _ in 0..<6 {
            guard i + 2 <= p.count else { return nil }
            let n = Int(p[i]) << 8 | Int(p[i + 1])
            i += 2
            if n == 0xFFFF { fields.append(nil); continue }
            guard n <= PAMRequestRules.maxFieldBytes, i + n <= p.count else { return nil }
            let bytes = p[i..<i + n]
            guard let s = String(validating: bytes, as: UTF8.self), PAMRequestRules.validField(s) else { return nil }
            fields.append(s)
            i += n
        }
        guard i == p.count, let service = fields[0], let user = fields[1],
              PAMRequestRules.validService(service) else { return nil }
        return PAMWireRequest(
            request: PAMRequest(service: service, user: user, ruser: fields[2], tty: fields[3], rhost: fields[4]),
            serviceDirectory: fields[5], deadlineSeconds: deadline)
    }
}

/// Blocking and non-blocking fd helpers shared by both sides. They retry on EINTR and never
/// raise SIGPIPE (MSG_NOSIGNAL): a dead peer is an error return, not the death of the broker.
package enum PAMIO {
    /// Writes all bytes; on a non-blocking fd waits for POLLOUT up to `deadline` (monotonic ns).
    package static func sendAll(_ fd: Int32, _ raw: UnsafeRawBufferPointer, deadline: UInt64? = nil) -> Bool {
        DescriptorIO.writeAll(fd, raw, socket: true, deadline: deadline) == 0
    }

    package static func sendFrame(_ fd: Int32, _ kind: PAMFrameKind, _ payload: [UInt8], deadline: UInt64? = nil) -> Bool {
        let bytes = PAMFrame.header(kind, payload.count) + payload
        return bytes.withUnsafeBytes { sendAll(fd, $0, deadline: deadline) }
    }

    /// Blocking read of exactly `count` bytes into `dst`; false on EOF or error.
    package static func readExact(_ fd: Int32, _ dst: UnsafeMutableRawPointer, _ count: Int) -> Bool {
        var got = 0
        while got < count {
            let n = read(fd, dst + got, count - got)
            if n > 0 { got += n; continue }
            if n < 0 && errno == EINTR { continue }
            return false
        }
        return true
    }
}
