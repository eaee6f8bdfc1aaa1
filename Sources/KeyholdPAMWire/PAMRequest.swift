/// The PAM transaction the broker asks its helper to run, and the checks both sides apply to
/// it. With PAMFrame.swift, all that keyhold-pam-helper and the broker share.

/// One PAM transaction to run: which service stack, for which user, with the facts the broker
/// verified about the caller's session (never values the client merely claims).
public struct PAMRequest: Sendable, Equatable {
    /// PAM service name (a file in the service directory): letters, digits, `.`, `_`, `-`.
    public var service: String
    /// The account to authenticate: the passwd name of the caller's kernel-verified uid.
    public var user: String
    /// PAM_RUSER: the requesting user (the caller's name).
    public var ruser: String?
    /// PAM_TTY: the caller's controlling terminal, e.g. `/dev/pts/3`.
    public var tty: String?
    /// PAM_RHOST: set only for a caller in a remote (SSH) session; pam_fprintd refuses those.
    public var rhost: String?

    public init(service: String, user: String, ruser: String? = nil, tty: String? = nil, rhost: String? = nil) {
        self.service = service
        self.user = user
        self.ruser = ruser
        self.tty = tty
        self.rhost = rhost
    }
}

/// Checks on request fields, applied by the broker before spawning and again by the helper.
package enum PAMRequestRules {
    /// PAM_MAX_RESP_SIZE: libpam and pam_unix do not handle longer answers.
    package static let maxConversationAnswerBytes = 512
    /// Longer module messages are cut (PAM_MAX_MSG_SIZE is 512; this leaves room).
    package static let maxMessageBytes = 4096
    package static let maxFieldBytes = 1024
    package static let maxServiceBytes = 128

    /// A service name becomes a path inside the service directory: no `/`, no `..`.
    package static func validService(_ s: String) -> Bool {
        let u = Array(s.utf8)
        guard !u.isEmpty, u.count <= maxServiceBytes, u.first != UInt8(ascii: ".") else { return false }
        return u.allSatisfy { b in
            (b >= 0x30 && b <= 0x39) || (b >= 0x41 && b <= 0x5A) || (b >= 0x61 && b <= 0x7A)
                || b == UInt8(ascii: ".") || b == UInt8(ascii: "_") || b == UInt8(ascii: "-")
        }
    }

    /// Any other field becomes a C string: no NUL, bounded, not empty.
    package static func validField(_ s: String) -> Bool {
        let u = s.utf8
        return !u.isEmpty && u.count <= maxFieldBytes && !u.contains(0)
    }
}
