import KeyholdCore
import KeyholdVault
import KeyholdTPM

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
    /// How the vault key is kept at rest (see KeyProtectorSetup).
    public var keyProtector = KeyProtectorChoice.auto
    /// The TSS TCTI of the TPM: the kernel's resource manager unless told otherwise.
    public var tpmTCTI = TPMDevice.defaultTCTI
    /// PCRs a newly sealed key is bound to (none by default: see SECURITY.md for the trade-off).
    public var tpmPCRs = PCRSelection.none
    /// Convert the vault key to this protector and exit, instead of serving.
    public var migrateKeyProtector: KeyProtectorKind?
    /// A file outside the state directory that records the audit head (rollback detection
    /// without a TPM), and the administrator's decision to serve a vault that is behind it.
    public var rollbackAnchor: String?
    public var acceptRollback = false
    /// Wrap the vault key under a new recovery key, print it once, and exit (RecoveryKeySetup).
    public var createRecoveryKey = false
    /// Restore the vault from this backup file and exit (Restore.swift).
    public var restoreFile: String?

    public static let usage = """
        usage: keyholdd [--state-dir DIR] [--socket PATH] [--socket-mode OCTAL]
                        [--pam-dir DIR] [--fprint-state-dir DIR] [--syslog-socket PATH]
                        [--free-space-reserve BYTES]
                        [--key-protector auto|tpm|file] [--tpm-tcti CONF] [--tpm-pcrs LIST]
                        [--rollback-anchor PATH [--accept-rollback]]
               keyholdd --migrate-key-protector tpm|file [--state-dir DIR] [--tpm-tcti CONF] [--tpm-pcrs LIST]
               keyholdd --create-recovery-key [--state-dir DIR] [--tpm-tcti CONF]
               keyholdd --restore FILE [--state-dir DIR] [--key-protector auto|tpm|file] [--accept-rollback]
               keyholdd --version

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
          --key-protector KIND    tpm: the vault key sealed by the TPM; file: vault.key on disk;
                                  auto (default): what the vault has, else tpm if /dev/tpmrm0 exists
          --tpm-tcti CONF         TSS TCTI of the TPM (default device:/dev/tpmrm0; swtpm:path=S)
          --tpm-pcrs LIST         bind a newly sealed key to these SHA-256 PCRs, e.g. 0,7
          --migrate-key-protector KIND  convert the vault key to KIND (crash-safe) and exit
          --rollback-anchor PATH  also record the audit head in PATH (outside the state directory);
                                  refuse a vault restored from an older copy
          --accept-rollback       serve such a vault anyway (audited), and re-anchor it
          --create-recovery-key   wrap the vault key under a new recovery key (creating the vault
                                  if needed), print it once on stdout, and exit
          --restore FILE          restore a backup made by `keyhold backup` into an empty state
                                  directory (recovery key read from stdin) and exit
          --version               print the version and exit
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
            case "--key-protector":
                guard let k = KeyProtectorChoice(rawValue: try value(a)) else { throw .bad("--key-protector wants auto, tpm or file") }
                keyProtector = k
            case "--tpm-tcti": tpmTCTI = try value(a)
            case "--rollback-anchor": rollbackAnchor = try value(a)
            case "--accept-rollback": acceptRollback = true
            case "--create-recovery-key": createRecoveryKey = true
            case "--restore": restoreFile = try value(a)
            case "--tpm-pcrs":
                guard let p = PCRSelection(list: try value(a)) else { throw .bad("--tpm-pcrs wants PCR numbers 0-23 such as 0,7") }
                tpmPCRs = p
            case "--migrate-key-protector":
                guard let k = KeyProtectorKind(rawValue: try value(a)) else { throw .bad("--migrate-key-protector wants tpm or file") }
                migrateKeyProtector = k
            default: throw .bad("unknown option '\(a)'")
            }
            i += 1
        }
    }
}
