import Foundation
import Glibc
import Testing
import KeyholdTestSupport

/// Mutated import sources through the real CLI and broker: a docker config.json and a
/// git-credentials file, each byte-flipped or cut short hundreds of times (a fixed seed, so a
/// failure repeats). Every run ends with a clear outcome (0, 1 or 2), never a crash, and prints
/// no secret of the source.
@Suite struct ImportMutationTests {
    /// SplitMix64: the same mutations on every run.
    struct Seeded {
        var state: UInt64
        mutating func next(_ bound: Int) -> Int {
            state &+= 0x9E37_79B9_7F4A_7C15
            var z = state
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            return Int((z ^ (z >> 31)) % UInt64(bound))
        }
    }

    static let interesting: [UInt8] = Array("{}[]\":,\\@/%\n u".utf8) + [0x00, 0x01, 0x7f, 0xc3, 0xff, 0x41]

    func mutate(_ seed: [UInt8], _ rng: inout Seeded) -> [UInt8] {
        var b = seed
        switch rng.next(4) {
        case 0: b = Array(b[0..<rng.next(b.count)])
        case 1: b.remove(at: rng.next(b.count))
        case 2: b.insert(Self.interesting[rng.next(Self.interesting.count)], at: rng.next(b.count))
        default: b[rng.next(b.count)] = Self.interesting[rng.next(Self.interesting.count)]
        }
        return b
    }

    func run(_ b: BrokerFixture, _ source: String, _ seed: String, secrets: [String], count: Int) throws {
        let dir = TestPaths.temporaryDirectory("khmu")
        var rng = Seeded(state: 0x6B65_7968_6F6C_64)
        for i in 0..<count {
            let file = dir + "/m\(i)"
            try Data(mutate(Array(seed.utf8), &rng)).write(to: URL(fileURLWithPath: file))
            // Through sh, so a death by signal shows as its 128+N status.
            let r = runCommand("/bin/sh", ["-c", "\"$0\" --socket \"$1\" import \"$2\" \"$3\"; echo \"status=$?\" >&2",
                                           TestPaths.keyhold, b.socketPath, source, file])
            let status = r.stderr.split(separator: "\n").last.map(String.init) ?? ""
            #expect(["status=0", "status=1", "status=2"].contains(status), "mutation \(i): \(r.stderr)")
            #expect(!r.stderr.contains("Fatal error"), "mutation \(i): \(r.stderr)")
            for s in secrets where r.stdoutText.contains(s) || r.stderr.contains(s) {
                Issue.record("mutation \(i) printed a secret (\(s.count) characters)")
            }
        }
    }

    @Test func mutatedDockerConfigsNeverCrashOrPrintASecret() throws {
        let b = try BrokerFixture()
        try run(b, "docker-config", ImportCredentialHelperTests.dockerConfig(),
                secrets: ["hub:pass", "eyJ-identity-token"], count: 200)
    }

    @Test func mutatedGitCredentialFilesNeverCrashOrPrintASecret() throws {
        let b = try BrokerFixture()
        let seed = "https://alice:pw-first-93%40x@github.com\nhttp://bob:pw-second-17@127.0.0.1:8080/repo.git/\n"
        try run(b, "git-credentials", seed, secrets: ["pw-first", "pw-second"], count: 200)
    }
}
