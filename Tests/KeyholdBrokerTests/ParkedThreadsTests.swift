import Foundation
import Synchronization
import Testing
@testable import KeyholdBroker

/// Reused connection threads: a connection never waits for another one to finish, and parked
/// threads do take later connections.
@Suite struct ParkedThreadsTests {
    @Test func aBlockedBodyHoldsUpNoOtherAndThreadsAreReused() throws {
        let pool = ParkedThreads(maxParked: 4)
        let gate = DispatchSemaphore(value: 0)
        let done = DispatchSemaphore(value: 0)
        let threads = Mutex<Set<UInt>>([])
        // Four bodies block until released; a fifth must still run at once.
        for _ in 0..<4 { #expect(pool.run { gate.wait(); done.signal() }) }
        let fifth = DispatchSemaphore(value: 0)
        #expect(pool.run { fifth.signal() })
        #expect(fifth.wait(timeout: .now() + 30) == .success)
        for _ in 0..<4 { gate.signal() }
        for _ in 0..<4 { #expect(done.wait(timeout: .now() + 30) == .success) }
        // Now sequential bodies: handed to parked threads, so few distinct threads serve 50.
        for _ in 0..<50 {
            let ran = DispatchSemaphore(value: 0)
            #expect(pool.run { threads.withLock { _ = $0.insert(UInt(pthread_self())) }; ran.signal() })
            #expect(ran.wait(timeout: .now() + 30) == .success)
            usleep(1_000)  // let the thread park again
        }
        #expect(threads.withLock { $0.count } <= 5)
    }
}
