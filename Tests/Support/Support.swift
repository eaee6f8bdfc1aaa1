// Test support shared by the test targets: fixtures that start real services.
import Foundation

/// Runs `count` real threads at once (not GCD workers, whose pool is too small to block dozens
/// at a time) and returns when all have finished.
public func runThreads(_ count: Int, _ body: @escaping @Sendable (Int) -> Void) {
    let done = DispatchSemaphore(value: 0)
    for i in 0..<count {
        let t = Thread { body(i); done.signal() }
        t.stackSize = 1 << 20
        t.start()
    }
    for _ in 0..<count { done.wait() }
}
