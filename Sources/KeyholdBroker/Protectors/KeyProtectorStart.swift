import Glibc
import KeyholdCore
import KeyholdVault
import KeyholdTPM

/// The start-up decision on the key protector and the TPM counter (issue 36 items 2 and 3):
/// serve, make or replace the counter, or refuse with *integrity*.
///
/// - A TPM vault needs its own counter: one that answers to this vault key's authorization
///   and is not ahead of the value the vault recorded. A counter removed (tpm2_nvundefine)
///   or replaced by another is refused like a rollback, never set up again silently.
/// - A file vault must not be one that was moved to the TPM: the move makes the counter at
///   the index its record names (a copy from before the move, with no record, finds the same
///   index from its key), so a counter there means this is an older copy or an old key file.
/// Both refusals end the process; `--accept-rollback` (TPM) or `--migrate-key-protector file`
/// (file) are the administrator's explicit, audited ways past them.
enum KeyProtectorStart {
    /// Returns the TPM counter to watch (nil for a file vault) and the accepted rollback's
    /// audit entry, if any.
    static func check(_ vault: KeyProtectorSetup.OpenedVault, _ options: BrokerOptions, _ access: TPMAccess,
                      executable: String) -> (TPMRollbackCounter?, AuditRecord?) {
        do throws(StoreError) {
            switch vault.kind {
            case .file:
                try checkFile(vault, access)
                return (nil, nil)
            case .tpm:
                return try checkTPM(vault, options, access, executable: executable)
            }
        } catch {
            BrokerMain.fail("cannot check the key protector of \(options.stateDirectory): \(error)", code: Int32(error.outcome.rawValue))
        }
    }

    // MARK: File

    static func checkFile(_ vault: KeyProtectorSetup.OpenedVault, _ access: TPMAccess) throws(StoreError) {
        if vault.record?.kind == .tpm {
            throw .keyProtector(.downgrade(detail: "the vault records that its key is sealed by the TPM, and this start would use \(KeyProtectorKind.file.fileName)"))
        }
        guard access.configured else { return }
        let counter = TPMRollbackCounter(access: access, index: vault.counterIndex, auth: vault.store.rollbackCounterAuth)
        if vault.record?.counter == .retiring {
            // A move to `file` cut off before its counter went: finish it if the TPM lets us;
            // the vault is a file vault either way (the record says so, under its key).
            do throws(StoreError) { try retire(counter, vault.store) } catch {
                note("the TPM counter 0x\(String(vault.counterIndex, radix: 16)) of the move to file could not be removed yet (\(error)); the next start tries again")
            }
            return
        }
        let found: TPMDevice.CounterState
        do throws(TPMError) { found = try counter.state() } catch {
            if case .unavailable = error {
                note("no TPM answers at \(access.tcti): whether this vault was moved to the TPM protector is not checked")
                return
            }
            throw .keyProtector(TPMKeyProtector.failure(error))
        }
        guard found == .absent else {
            throw .keyProtector(.downgrade(detail: "the TPM holds a rollback counter at this vault's NV index 0x\(String(vault.counterIndex, radix: 16)): the vault was moved to the TPM protector, and this is a copy from before the move or its old key file"))
        }
    }

    /// Moving to `file`, after the record said so: the counter goes (the owner hierarchy's
    /// authorization), then the record says it is gone.
    static func retire(_ counter: TPMRollbackCounter, _ store: VaultStore) throws(StoreError) {
        do throws(TPMError) {
            let device = try counter.access.open()
            try device.undefineCounter(index: counter.index)
        } catch {
            throw .keyProtector(TPMKeyProtector.failure(error))
        }
        try store.recordProtector(ProtectorRecord(kind: .file, counterIndex: counter.index, counter: .none), audit: nil)
    }

    // MARK: TPM

    enum Finding: Equatable {
        case current(UInt64)
        case define(replacing: Bool)
        case refuse(String)
    }

    static func checkTPM(_ vault: KeyProtectorSetup.OpenedVault, _ options: BrokerOptions, _ access: TPMAccess,
                         executable: String) throws(StoreError) -> (TPMRollbackCounter?, AuditRecord?) {
        let store = vault.store
        if vault.record?.kind == .file { throw .keyProtector(.protectedBy(.file, wanted: .tpm)) }
        let record = vault.record ?? ProtectorRecord(kind: .tpm, counterIndex: store.defaultCounterIndex, counter: .pending)
        let counter = TPMRollbackCounter(access: access, index: record.counterIndex, auth: store.rollbackCounterAuth)
        let recorded = try store.recordedRollbackCounter()
        let found: TPMDevice.CounterState, legacy: UInt64?
        do throws(TPMError) {
            found = try counter.state()
            legacy = found == .foreign ? try access.open().legacyCounterValue(index: record.counterIndex) : nil
        } catch { throw .keyProtector(TPMKeyProtector.failure(error)) }
        let started = try store.authenticatedHeadSequence() > 0
        var finding = decide(record.counter, unrecorded: vault.record == nil, found, legacy: legacy, recorded: recorded, started: started)

        var accepted: AuditRecord?
        if case .refuse(let why) = finding {
            guard options.acceptRollback else {
                BrokerMain.fail("integrity failure: the vault was restored from an older copy, or its TPM counter was disturbed (\(why)); nothing is served. If this copy is what you want, start once with --accept-rollback (the decision is audited)",
                                code: Int32(Outcome.integrityFailure.rawValue))
            }
            let reason = "tpm-counter index=0x\(String(record.counterIndex, radix: 16)) recorded=\(recorded.map(String.init) ?? "none") tpm=\(TPMRollbackCounter.describe(found))"
            let entry = AuditRecord(callerUID: geteuid(), callerPID: getpid(), executable: executable, operation: .acceptRollback,
                                    decision: .granted, reason: reason, outcome: .ok)
            try store.append(entry)
            accepted = entry
            if case .ours(let v) = found { finding = .current(v ?? 0) } else { finding = .define(replacing: found != .absent) }
        }
        let value: UInt64
        switch finding {
        case .current(let v): value = v
        case .define(let replacing):
            do throws(TPMError) { value = try counter.define(replacing: replacing) } catch {
                throw .keyProtector(TPMKeyProtector.failure(error))
            }
        case .refuse: preconditionFailure("handled above")
        }
        try counter.adopt(store, value: value)
        if record.counter != .established || vault.record == nil {
            try store.recordProtector(ProtectorRecord(kind: .tpm, counterIndex: record.counterIndex, counter: .established), audit: nil)
        }
        return (counter, accepted)
    }

    /// The decision, from what the vault records and what the TPM has. `unrecorded`: a vault
    /// from before issue 36 (no record; its counter, if any, has an empty auth value).
    /// `started`: its audit has entries (a vault that never started has nothing to roll back).
    static func decide(_ state: ProtectorRecord.Counter, unrecorded: Bool, _ found: TPMDevice.CounterState,
                       legacy: UInt64?, recorded: UInt64?, started: Bool) -> Finding {
        switch (state, found) {
        case (.none, _), (.retiring, _):
            return .refuse("its record names no TPM counter")
        case (_, .ours(let v)):
            let tpm = v ?? 0
            guard let recorded else {
                // Made, and killed before its value was recorded: adopt it. An established
                // vault without a value is one whose record was removed.
                return state == .established ? .refuse("it records no counter value, the TPM is at \(tpm)") : .current(tpm)
            }
            return recorded >= tpm ? .current(tpm) : .refuse("it records TPM counter \(recorded), the TPM is at \(tpm)")
        case (.established, .absent), (.established, .foreign):
            return .refuse("it records TPM counter \(recorded.map(String.init) ?? "none"), the TPM has \(TPMRollbackCounter.describe(found))")
        case (.pending, .absent):
            // A vault from before issue 36 that had a counter must find it.
            return unrecorded && (recorded != nil || started) ? .refuse("its TPM counter was removed") : .define(replacing: false)
        case (.pending, .foreign):
            guard unrecorded else { return .define(replacing: true) }  // re-keyed: the old key's counter goes
            // The counter of before issue 36 (empty auth): checked as before, then replaced.
            if let legacy {
                guard let recorded, recorded >= legacy else {
                    return .refuse("it records TPM counter \(recorded.map(String.init) ?? "none"), the TPM is at \(legacy)")
                }
                return .define(replacing: true)
            }
            return started || recorded != nil ? .refuse("the TPM has \(TPMRollbackCounter.describe(found))") : .define(replacing: true)
        }
    }

    static func note(_ message: String) {
        let text = "keyholdd: \(message)\n"
        _ = text.withCString { write(2, $0, strlen($0)) }
    }
}
