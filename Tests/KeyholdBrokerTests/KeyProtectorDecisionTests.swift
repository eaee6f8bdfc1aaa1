import Testing
import KeyholdTPM
import KeyholdVault
@testable import KeyholdBroker

/// The start's decision on a TPM vault's counter (KeyProtectorStart.decide), every case: what
/// the vault records against what the TPM has. The TPM-backed cases are also attacked end to
/// end (TPMCounterAuthorizationTests, TPMLegacyCounterTests, TPMRollbackTests); this table
/// pins the cases those cannot reach cheaply (a crash between defining and recording).
@Suite struct KeyProtectorDecisionTests {
    typealias F = KeyProtectorStart.Finding

    func decide(_ state: ProtectorRecord.Counter, unrecorded: Bool = false, _ found: TPMDevice.CounterState,
                legacy: UInt64? = nil, recorded: UInt64?, started: Bool = true) -> F {
        KeyProtectorStart.decide(state, unrecorded: unrecorded, found, legacy: legacy, recorded: recorded, started: started)
    }

    func refused(_ f: F) -> Bool { if case .refuse = f { true } else { false } }

    @Test func establishedCounter() {
        #expect(decide(.established, .ours(7), recorded: 7) == .current(7))
        #expect(decide(.established, .ours(7), recorded: 8) == .current(7))   // killed after recording C+1
        #expect(refused(decide(.established, .ours(8), recorded: 7)))          // an older copy
        #expect(refused(decide(.established, .ours(8), recorded: nil)))        // its value row removed
        #expect(refused(decide(.established, .absent, recorded: 7)))           // undefined
        #expect(refused(decide(.established, .foreign, recorded: 7)))          // replaced
    }

    @Test func pendingAfterTheRekey() {
        #expect(decide(.pending, .absent, recorded: nil) == .define(replacing: false))
        #expect(decide(.pending, .ours(9), recorded: nil) == .current(9))      // killed after defining
        #expect(decide(.pending, .foreign, legacy: 5, recorded: nil) == .define(replacing: true))  // the old key's
    }

    @Test func vaultFromBeforeIssue36() {
        #expect(decide(.pending, unrecorded: true, .absent, recorded: nil, started: false) == .define(replacing: false))  // new
        #expect(refused(decide(.pending, unrecorded: true, .absent, recorded: 4)))        // its counter removed
        #expect(refused(decide(.pending, unrecorded: true, .absent, recorded: nil)))      // started, no value, no counter
        #expect(decide(.pending, unrecorded: true, .foreign, legacy: 4, recorded: 4) == .define(replacing: true))
        #expect(refused(decide(.pending, unrecorded: true, .foreign, legacy: 5, recorded: 4)))    // behind the old counter
        #expect(refused(decide(.pending, unrecorded: true, .foreign, legacy: nil, recorded: 4)))  // not the old kind either
        #expect(decide(.pending, unrecorded: true, .foreign, legacy: nil, recorded: nil, started: false) == .define(replacing: true))
    }

    @Test func aFileRecordNamesNoCounter() {
        #expect(refused(decide(.none, .ours(1), recorded: 1)))
        #expect(refused(decide(.none, .absent, recorded: nil)))
        #expect(refused(decide(.retiring, .foreign, recorded: nil)))
    }
}
