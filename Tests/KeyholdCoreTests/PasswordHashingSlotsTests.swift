import Foundation
import Synchronization
@testable import KeyholdCore
@testable import KeyholdVault
import Testing

/// Argon2id derivations are bounded in number (so in memory): a root broker never runs more
/// than `PasswordHashingSlots.shared` allows at once, whoever asks.
@Suite struct PasswordHashingSlotsTests {
    @Test func atMostCapacityRunAtOnceAndEveryOneRuns() {
        let slots = PasswordHashingSlots(capacity: 2)
        let running = Mutex(0), peak = Mutex(0), ran = Mutex(0)
        let done = DispatchSemaphore(value: 0)
        for _ in 0..<8 {
            Thread {
                slots.withSlot {
                    let now = running.withLock { $0 += 1; return $0 }
                    peak.withLock { $0 = max($0, now) }
                    usleep(20_000)
                    running.withLock { $0 -= 1 }
                    ran.withLock { $0 += 1 }
                }
                done.signal()
            }.start()
        }
        for _ in 0..<8 { done.wait() }
        #expect(ran.withLock { $0 } == 8)
        #expect(peak.withLock { $0 } <= 2)
    }

    /// While both of the shared slots are held, a derivation waits; it runs once one is let go.
    @Test func aDerivationWaitsForASharedSlot() throws {
        let holding = DispatchSemaphore(value: 0), letGo = DispatchSemaphore(value: 0)
        for _ in 0..<2 {
            Thread { PasswordHashingSlots.shared.withSlot { holding.signal(); letGo.wait() } }.start()
        }
        holding.wait()
        holding.wait()
        let derived = Mutex(false), finished = DispatchSemaphore(value: 0)
        Thread {
            let key = try? PasswordKey.derive(password: SecureBytes(copying: Array("pw".utf8)),
                                              parameters: PasswordHashParameters.generate(.interactive))
            derived.withLock { $0 = key != nil }
            finished.signal()
        }.start()
        #expect(finished.wait(timeout: .now() + 0.5) == .timedOut, "a derivation ran while both slots were held")
        letGo.signal()
        letGo.signal()
        #expect(finished.wait(timeout: .now() + 30) == .success)
        #expect(derived.withLock { $0 })
    }
}
