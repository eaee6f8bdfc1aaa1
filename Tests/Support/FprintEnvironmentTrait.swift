// A Swift Testing trait that gives one suite (or one test) its own private fprintd:
//   @Suite(.serialized, .fprintEnvironment()) struct FingerTests {
//       @Test func x() throws { let fp = try #require(FprintEnvironment.current) ... }
//   }
// Started before the first test of the suite, stopped after the last one, also on failure.
import Testing

extension FprintEnvironment {
    /// The environment of the innermost `.fprintEnvironment()` trait around the running test.
    @TaskLocal public static var current: FprintEnvironment?
}

public struct FprintEnvironmentTrait: SuiteTrait, TestTrait, TestScoping {
    public let driver: FprintEnvironment.Driver

    /// Once per suite, not once per test: one fprintd serves the (serialized) suite.
    public var isRecursive: Bool { false }

    public func provideScope(for test: Test, testCase: Test.Case?,
                             performing function: @Sendable () async throws -> Void) async throws {
        let env = try FprintEnvironment.start(driver: driver)
        defer { env.stop() }
        try await FprintEnvironment.$current.withValue(env) { try await function() }
    }
}

extension Trait where Self == FprintEnvironmentTrait {
    /// A private D-Bus + polkit mock + fprintd with the virtual reader for this suite.
    /// Combine with `.serialized`: the one reader cannot serve two tests at once.
    public static func fprintEnvironment(_ driver: FprintEnvironment.Driver = .virtualDevice) -> Self {
        FprintEnvironmentTrait(driver: driver)
    }
}
