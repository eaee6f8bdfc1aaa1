// swift-tools-version: 6.0
import PackageDescription

// Keyhold: a credential vault for Linux. See docs/ARCHITECTURE.md and SECURITY.md.
// Each target has one job; only the broker links the vault (keys, store, audit chain), and
// every parser of untrusted bytes is listed in SECURITY.md ("Untrusted input").
let package = Package(
    name: "Keyhold",
    products: [
        .executable(name: "keyholdd", targets: ["keyholdd"]),
        .executable(name: "keyhold-pam-helper", targets: ["keyhold-pam-helper"]),
        .executable(name: "keyhold", targets: ["keyhold"]),
        .library(name: "KeyholdClient", targets: ["KeyholdClient"]),
        .executable(name: "git-credential-keyhold", targets: ["git-credential-keyhold"]),
        .executable(name: "docker-credential-keyhold", targets: ["docker-credential-keyhold"]),
        .executable(name: "keyhold-secret-service", targets: ["keyhold-secret-service"]),
    ],
    targets: [
        // C libraries from Debian's -dev packages. Module maps and shims only, no logic.
        .systemLibrary(name: "CSodium", pkgConfig: "libsodium", providers: [.apt(["libsodium-dev"])]),
        .systemLibrary(name: "CPAM", pkgConfig: "pam", providers: [.apt(["libpam0g-dev"])]),
        .systemLibrary(name: "CSQLite", pkgConfig: "sqlite3", providers: [.apt(["libsqlite3-dev"])]),
        // sd-bus (libsystemd) for the Secret Service agent only; never linked into the broker.
        .systemLibrary(name: "CSystemd", pkgConfig: "libsystemd", providers: [.apt(["libsystemd-dev"])]),
        // The Secret Service session crypto (modp-1024 DH, HKDF-SHA256, AES-128-CBC) on OpenSSL's
        // libcrypto, which libsodium lacks. The agent's target only.
        .target(name: "CKeyholdSS", linkerSettings: [.linkedLibrary("crypto")]),
        // The TPM2 software stack (ESAPI, TCTI loader, marshalling) for the broker's key protector.
        .systemLibrary(name: "CTSS2", pkgConfig: "tss2-esys", providers: [.apt(["libtss2-dev"])]),
        // The few Linux calls Swift cannot make directly (SO_PEERCRED, prctl, accept4, sigmask).
        .target(name: "CKeyholdOS"),
        // `keyhold rotate`'s COMMAND in a process group that dies with keyhold (a warden process,
        // PR_SET_PDEATHSIG, the terminal's foreground group). The CLI's only: not compiled into root.
        .target(name: "CKeyholdSpawn"),

        // The model every process shares: item and policy types, Outcome, limits, SecureBytes,
        // hex, printable escaping, the audit-export value types. No keys, no store, no SQLite.
        .target(name: "KeyholdCore", dependencies: ["CSodium"]),
        // The vault: keys, sealed boxes, the SQLite store, the audit chain. Only the broker (and
        // the benchmark and tests) link it, so "the client holds no keys" is enforced by the build.
        .target(
            name: "KeyholdVault",
            dependencies: ["KeyholdCore", "CSodium", "CSQLite", "CKeyholdOS"],
            resources: [.embedInCode("../../schema.sql")]
        ),
        // The broker wire protocol: frames and messages. All parsing of bytes from a peer.
        .target(name: "KeyholdProtocol", dependencies: ["KeyholdCore", "CKeyholdOS"]),
        // PAM transactions as the broker runs them (through the helper process) and fprintd
        // enrolment state. Decides no policy; does not link libpam.
        .target(name: "KeyholdAuth", dependencies: ["KeyholdPAMWire", "KeyholdCore", "CSodium", "CKeyholdOS"]),
        // What the broker and its PAM helper share: the request, its checks and the framing.
        .target(name: "KeyholdPAMWire", dependencies: ["KeyholdCore"]),
        // The helper's side: one PAM transaction through libpam. Linked into keyhold-pam-helper only.
        .target(name: "KeyholdPAMHelper", dependencies: ["KeyholdPAMWire", "KeyholdCore", "CPAM", "CKeyholdOS"]),
        // TPM 2.0 through the TSS (ESAPI): sealing the vault key. Its parsing of TPM-made bytes
        // (the sealed-key file) is one of the untrusted-input parsers. Linked into the broker only.
        .target(name: "KeyholdTPM", dependencies: ["CTSS2"]),
        // The daemon: socket, peer credentials, policy evaluation, lockout, audit-before-release.
        .target(name: "KeyholdBroker", dependencies: ["KeyholdCore", "KeyholdVault", "KeyholdProtocol", "KeyholdAuth", "KeyholdTPM", "CKeyholdOS"]),
        // The Swift API applications call. Holds no keys.
        .target(name: "KeyholdClient", dependencies: ["KeyholdProtocol", "KeyholdCore", "CKeyholdOS"]),

        // The `keyhold` command: argument parsing, terminal prompts, askpass, output formats.
        .target(name: "KeyholdCLI", dependencies: ["KeyholdClient", "KeyholdCore", "CKeyholdOS", "CKeyholdSpawn"]),

        // git-credential and docker-credential helpers: their protocol parsing and the one item mapping.
        .target(name: "KeyholdCredentialHelpers", dependencies: ["KeyholdClient", "KeyholdCore", "KeyholdCLI"]),
        // Static like `keyhold`, for the same reason: git and docker start them once per credential.
        .executableTarget(name: "git-credential-keyhold", dependencies: ["KeyholdCredentialHelpers"],
                          linkerSettings: [.unsafeFlags(["-static-executable"])]),
        .executableTarget(name: "docker-credential-keyhold", dependencies: ["KeyholdCredentialHelpers"],
                          linkerSettings: [.unsafeFlags(["-static-executable"])]),
        // The Secret Service agent: D-Bus object tree, session crypto, attribute mapping. Runs as
        // the user, holds no key, forwards to the broker. All parsing of bus input is here.
        .target(name: "KeyholdSecretService", dependencies: ["KeyholdClient", "KeyholdCLI", "KeyholdCore", "CSystemd", "CKeyholdSS"]),
        .executableTarget(name: "keyhold-secret-service", dependencies: ["KeyholdSecretService"]),

        .executableTarget(name: "keyholdd", dependencies: ["KeyholdBroker"]),
        // One PAM transaction per process, started by keyholdd: libpam and the model only.
        .executableTarget(name: "keyhold-pam-helper", dependencies: ["KeyholdPAMHelper"]),
        // Linked fully static (Swift runtime, libsodium, libc): the CLI runs once per `get`, and the
        // dynamic loader was a third of its start-up. See scripts/bench.sh for the measurement.
        .executableTarget(name: "keyhold", dependencies: ["KeyholdCLI"],
                          linkerSettings: [.unsafeFlags(["-static-executable"])]),
        .executableTarget(name: "keyhold-bench", dependencies: ["KeyholdClient", "KeyholdCore", "KeyholdVault"]),

        // Shared test fixtures (broker, private D-Bus + fprintd + virtual reader). Tests only.
        .target(name: "KeyholdTestSupport", dependencies: ["KeyholdCore"], path: "Tests/Support"),

        .testTarget(name: "KeyholdCoreTests", dependencies: ["KeyholdCore", "KeyholdVault", "KeyholdTestSupport"]),
        .testTarget(name: "KeyholdProtocolTests", dependencies: ["KeyholdProtocol", "KeyholdClient", "KeyholdTestSupport"]),
        .testTarget(name: "KeyholdCLITests", dependencies: ["KeyholdCLI"]),
        // The broker's own parts driven directly (group commit, the release gate), against a real SQLite
        // vault; the gate through real libpam with keyhold-pam-helper.
        .testTarget(name: "KeyholdBrokerTests", dependencies: ["KeyholdBroker", "KeyholdCore", "KeyholdVault", "KeyholdTestSupport", "keyholdd", "keyhold-pam-helper"]),
        .testTarget(name: "KeyholdCredentialHelpersTests", dependencies: ["KeyholdCredentialHelpers", "KeyholdTestSupport"]),
        // Against Debian's swtpm, started by the tests.
        .testTarget(name: "KeyholdTPMTests", dependencies: ["KeyholdTPM", "KeyholdTestSupport"]),
        .testTarget(name: "KeyholdAuthTests", dependencies: ["KeyholdAuth", "CPAM", "KeyholdCLI", "KeyholdTestSupport", "keyholdd", "keyhold-pam-helper"]),
        // Real dbus-daemon, real agent, real broker, real secret-tool / python secretstorage.
        .testTarget(name: "KeyholdSecretServiceTests",
                    dependencies: ["KeyholdSecretService", "KeyholdClient", "KeyholdCore", "KeyholdTestSupport",
                                   "keyholdd", "keyhold-pam-helper", "keyhold-secret-service"]),
        // Real broker over its real socket, driven through the client library and the CLI.
        .testTarget(name: "KeyholdIntegrationTests", dependencies: ["KeyholdClient", "KeyholdProtocol", "KeyholdCore", "KeyholdVault", "KeyholdTestSupport", "keyholdd", "keyhold-pam-helper"]),
    ]
)
