import KeyholdCore
import KeyholdVault
import KeyholdProtocol

/// What the broker knows about one answered request, turned into the store's audit record.
struct AuditEvent {
    typealias Operation = AuditOperation
    typealias Decision = AuditDecision

    let caller: Caller
    let operation: Operation
    var itemID: ItemID? = nil
    var item: ItemReference? = nil
    let decision: Decision
    var method: AuthMethod = .none
    var reason: String? = nil
    let outcome: Outcome

    func record() -> AuditRecord {
        AuditRecord(time: currentMicroseconds(), callerUID: caller.uid, callerPID: caller.pid, executable: caller.executable,
                    operation: operation, itemID: itemID, service: item?.service, account: item?.account,
                    decision: decision, method: method, reason: reason, outcome: outcome)
    }
}
