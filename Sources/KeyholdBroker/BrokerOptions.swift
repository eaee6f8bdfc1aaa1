/// Command line of `keyholdd`. Small on purpose: every option is one an administrator or a
/// test needs, none weakens the vault.
public struct BrokerOptions: Sendable, Equatable {
    public var stateDirectory = "/var/lib/keyhold"
    public var socketPath = "/run/keyhold/keyhold.sock"
    /// Mode of the socket file. 0666 by default: every user may ask; the broker decides.
    public var socketMode: UInt32 = 0o666
    /// A directory of PAM service files instead of the system's /etc/pam.d.
    public var pamDirectory: String?
    /// Where fprintd keeps enrolled prints (`STATE_DIRECTORY` of fprintd).
    public var fprintStateDirectory = "/var/lib/fprint"
    /// The system log socket that receives a copy of each audit entry.
    public var syslogSocket = "/dev/log"
    /// Free space (bytes) kept on the state directory's file system for the broker's own audit
    /// writes: item writes that would eat into it are refused.
    public var freeSpaceReserve: UInt64 = 64 << 20

    public static let usage = """
        usage: keyholdd [--state-dir DIR] [--socket PATH] [--socket-mode OCTAL]
                        [--pam-dir DIR] [--fprint-state-dir DIR] [--syslog-socket PATH]
                        [--free-space-reserve BYTES]

        The Keyhold broker: owns the vault, authenticates callers through PAM, audits every
        request. Runs as root (or the vault's owner); refuses a state directory or key file that
        group or others can access.

          --state-dir DIR         vault directory (default /var/lib/keyhold), mode 0700
          --socket PATH           Unix socket to listen on (default /run/keyhold/keyhold.sock)
          --socket-mode OCTAL     mode of the socket file (default 666)
          --pam-dir DIR           PAM service files from DIR instead of /etc/pam.d
          --fprint-state-dir DIR  fprintd's print store (default /var/lib/fprint)
          --syslog-socket PATH    where audit copies go (default /dev/log, facility authpriv)
          --free-space-reserve BYTES  free space kept for audit entries; item writes that
                                  would eat into it are refused (default 67108864, 64 MiB)
        """

    public enum ParseError: Error, Equatable { case help, bad(String) }

    public init() {}

    public init(parsing arguments: [String]) throws(ParseError) {
        var i = 0
        func value(_ name: String) throws(ParseError) -> String {
            i += 1
            guard i < arguments.count, !arguments[i].isEmpty else { throw .bad("\(name) needs a value") }
            return arguments[i]
        }
        while i < arguments.count {
            let a = arguments[i]
            switch a {
            case "--help", "-h": throw .help
            case "--state-dir": stateDirectory = try value(a)
            case "--socket": socketPath = try value(a)
            case "--pam-dir": pamDirectory = try value(a)
            case "--fprint-state-dir": fprintStateDirectory = try value(a)
            case "--syslog-socket": syslogSocket = try value(a)
            case "--free-space-reserve":
                guard let n = UInt64(try value(a)) else { throw .bad("--free-space-reserve wants a number of bytes") }
                freeSpaceReserve = n
            case "--socket-mode":
                let v = try value(a)
                guard let m = UInt32(v, radix: 8), m <= 0o777 else { throw .bad("--socket-mode wants an octal mode such as 660") }
                socketMode = m
            default: throw .bad("unknown option '\(a)'")
            }
            i += 1
        }
    }
}
