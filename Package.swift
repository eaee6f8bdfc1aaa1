// swift-tools-version: 6.0
import PackageDescription

// Keyhold: a credential vault for Linux. See ../shared/DESIGN.md and SECURITY.md.
// Each target has one job; the privileged broker stays small and untrusted input is
// parsed only in KeyholdProtocol.
let package = Package(
    name: "Keyhold",
    products: [
        .executable(name: "keyholdd", targets: ["keyholdd"]),
        .executable(name: "keyhold", targets: ["keyhold"]),
        .library(name: "KeyholdClient", targets: ["KeyholdClient"]),
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
        // The few Linux calls Swift cannot make directly (SO_PEERCRED, prctl, accept4, sigmask).
        .target(name: "CKeyholdOS"),

        // Crypto, store, item and policy model, audit chain. No sockets, no terminals.
        .target(
            name: "KeyholdCore",
            dependencies: ["CSodium", "CSQLite", "CKeyholdOS"],
            resources: [.embedInCode("../../schema.sql")]
        ),
        // The broker wire protocol: frames and messages. All parsing of bytes from a peer.
        .target(name: "KeyholdProtocol", dependencies: ["KeyholdCore"]),
        // PAM transactions (in a helper process) and fprintd enrolment state. Decides no policy.
        .target(name: "KeyholdAuth", dependencies: ["KeyholdCore", "CPAM", "CSodium", "CKeyholdOS"]),
        // The daemon: socket, peer credentials, policy evaluation, lockout, audit-before-release.
        .target(name: "KeyholdBroker", dependencies: ["KeyholdCore", "KeyholdProtocol", "KeyholdAuth", "CKeyholdOS"]),
        // The Swift API applications call. Holds no keys.
        .target(name: "KeyholdClient", dependencies: ["KeyholdProtocol", "KeyholdCore", "CKeyholdOS"]),

        // The `keyhold` command: argument parsing, terminal prompts, askpass, output formats.
        .target(name: "KeyholdCLI", dependencies: ["KeyholdClient", "KeyholdCore", "CKeyholdOS"]),

        // The Secret Service agent: D-Bus object tree, session crypto, attribute mapping. Runs as
        // the user, holds no key, forwards to the broker. All parsing of bus input is here.
        .target(name: "KeyholdSecretService", dependencies: ["KeyholdClient", "KeyholdCLI", "KeyholdCore", "CSystemd", "CKeyholdSS"]),
        .executableTarget(name: "keyhold-secret-service", dependencies: ["KeyholdSecretService"]),

        .executableTarget(name: "keyholdd", dependencies: ["KeyholdBroker", "KeyholdAuth"]),
        .executableTarget(name: "keyhold", dependencies: ["KeyholdCLI"]),
        .executableTarget(name: "keyhold-bench", dependencies: ["KeyholdClient", "KeyholdCore"]),

        // Shared test fixtures (broker, private D-Bus + fprintd + virtual reader). Tests only.
        .target(name: "KeyholdTestSupport", dependencies: ["KeyholdCore"], path: "Tests/Support"),

        .testTarget(name: "KeyholdCoreTests", dependencies: ["KeyholdCore"]),
        .testTarget(name: "KeyholdProtocolTests", dependencies: ["KeyholdProtocol"]),
        .testTarget(name: "KeyholdCLITests", dependencies: ["KeyholdCLI"]),
        .testTarget(name: "KeyholdAuthTests", dependencies: ["KeyholdAuth", "KeyholdTestSupport", "keyholdd"]),
        // Real broker over its real socket, driven through the client library and the CLI.
        // Real dbus-daemon, real agent, real broker, real secret-tool / python secretstorage.
        .testTarget(name: "KeyholdSecretServiceTests",
                    dependencies: ["KeyholdSecretService", "KeyholdClient", "KeyholdCore", "KeyholdTestSupport",
                                   "keyholdd", "keyhold", "keyhold-secret-service"]),
        .testTarget(name: "KeyholdIntegrationTests", dependencies: ["KeyholdClient", "KeyholdCore", "KeyholdTestSupport", "keyholdd", "keyhold"]),
    ]
)
