// swift-tools-version: 6.0
import PackageDescription

// Keyhold: a credential vault for Linux. See docs/ARCHITECTURE.md and SECURITY.md.
// Each target has one job; only the broker links the vault (keys, store, audit chain), and
// every parser of untrusted bytes is listed in SECURITY.md ("Untrusted input").
let package = Package(
    name: "Keyhold",
    products: [
        .executable(name: "keyholdd", targets: ["keyholdd"]),
        .executable(name: "keyhold", targets: ["keyhold"]),
        .library(name: "KeyholdClient", targets: ["KeyholdClient"]),
    ],
    targets: [
        // C libraries from Debian's -dev packages. Module maps and shims only, no logic.
        .systemLibrary(name: "CSodium", pkgConfig: "libsodium", providers: [.apt(["libsodium-dev"])]),
        .systemLibrary(name: "CPAM", pkgConfig: "pam", providers: [.apt(["libpam0g-dev"])]),
        .systemLibrary(name: "CSQLite", pkgConfig: "sqlite3", providers: [.apt(["libsqlite3-dev"])]),
        // The few Linux calls Swift cannot make directly (SO_PEERCRED, prctl, accept4, sigmask).
        .target(name: "CKeyholdOS"),

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
        .target(name: "KeyholdProtocol", dependencies: ["KeyholdCore"]),
        // PAM transactions (in a helper process) and fprintd enrolment state. Decides no policy.
        .target(name: "KeyholdAuth", dependencies: ["KeyholdCore", "CPAM", "CSodium", "CKeyholdOS"]),
        // The daemon: socket, peer credentials, policy evaluation, lockout, audit-before-release.
        .target(name: "KeyholdBroker", dependencies: ["KeyholdCore", "KeyholdVault", "KeyholdProtocol", "KeyholdAuth", "CKeyholdOS"]),
        // The Swift API applications call. Holds no keys.
        .target(name: "KeyholdClient", dependencies: ["KeyholdProtocol", "KeyholdCore", "CKeyholdOS"]),

        // The `keyhold` command: argument parsing, terminal prompts, askpass, output formats.
        .target(name: "KeyholdCLI", dependencies: ["KeyholdClient", "KeyholdCore", "CKeyholdOS"]),

        .executableTarget(name: "keyholdd", dependencies: ["KeyholdBroker", "KeyholdAuth"]),
        // Linked fully static (Swift runtime, libsodium, libc): the CLI runs once per `get`, and the
        // dynamic loader was a third of its start-up. See scripts/bench.sh for the measurement.
        .executableTarget(name: "keyhold", dependencies: ["KeyholdCLI"],
                          linkerSettings: [.unsafeFlags(["-static-executable"])]),
        .executableTarget(name: "keyhold-bench", dependencies: ["KeyholdClient", "KeyholdCore", "KeyholdVault"]),

        // Shared test fixtures (broker, private D-Bus + fprintd + virtual reader). Tests only.
        .target(name: "KeyholdTestSupport", dependencies: ["KeyholdCore"], path: "Tests/Support"),

        .testTarget(name: "KeyholdCoreTests", dependencies: ["KeyholdCore", "KeyholdVault"]),
        .testTarget(name: "KeyholdProtocolTests", dependencies: ["KeyholdProtocol"]),
        .testTarget(name: "KeyholdCLITests", dependencies: ["KeyholdCLI"]),
        .testTarget(name: "KeyholdAuthTests", dependencies: ["KeyholdAuth", "KeyholdCLI", "KeyholdTestSupport", "keyholdd"]),
        // Real broker over its real socket, driven through the client library and the CLI.
        .testTarget(name: "KeyholdIntegrationTests", dependencies: ["KeyholdClient", "KeyholdCore", "KeyholdVault", "KeyholdTestSupport", "keyholdd"]),
    ]
)
