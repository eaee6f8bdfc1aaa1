import CTSS2

/// A TPM NV counter (TPM2_NT_COUNTER): the TPM only ever lets it grow, and it survives
/// restoring any file. The broker keeps one per vault for rollback detection.
///
/// Authorization (issue 36 item 3): the counter is written and read with its own auth value,
/// which only the vault key's holder can compute (the broker passes it in). No owner or
/// platform write: TPMA_NV_OWNERWRITE is clear, so not even the owner hierarchy's holder
/// increments it. It is given as a password session: through the kernel's resource manager no
/// other process sees a command, and whoever could (a sniffer on the TPM bus) could only move
/// the counter up, which the broker reports (*integrity*): a denial of service, never a
/// rollback. (An HMAC session would hide it from the bus too, at 7 to 18 ms more per
/// increment in the TSS's host-side work, measured on swtpm.) Its definition travels encrypted.
/// Anyone may still read it through the owner hierarchy when its auth is empty (OWNERREAD:
/// tpm2_nvread -C o, for an administrator; a value is no secret). Undefining takes the owner
/// hierarchy's authorization (TPMA_NV_POLICY_DELETE, the one way to need more, is for indices of
/// the platform hierarchy, which the firmware keeps): with an owner password set, only
/// whoever holds it; with an empty one, any process that can open the TPM. The broker then
/// finds its counter gone or replaced (a new index does not answer to the vault's auth value)
/// and refuses: a denial of service, never a rollback.
///
/// Wear: each increment is an NV write. The broker increments only for changes that matter
/// for rollback (delete, update, audit prune, a denied attempt), not for reads.
extension TPMDevice {
    /// The attributes the broker defines its counter with; a counter with other attributes at
    /// its index is not its own.
    static let counterAttributes: TPMA_NV = (TPMA_NV(TPM2_NT_COUNTER) << TPMA_NV(TPMA_NV_TPM2_NT_SHIFT))
        | TPMA_NV_AUTHWRITE | TPMA_NV_AUTHREAD | TPMA_NV_OWNERREAD | TPMA_NV_NO_DA
    /// Set by the TPM, not by the definer: left out when comparing.
    static let stateAttributes: TPMA_NV = TPMA_NV_WRITTEN | TPMA_NV_WRITELOCKED | TPMA_NV_READLOCKED

    /// What is at a counter's index.
    public enum CounterState: Equatable, Sendable {
        case absent
        /// The broker's counter (its attributes, and it answers to `auth`); its value, nil
        /// when never incremented.
        case ours(UInt64?)
        /// Something else: another definition, or a counter with another auth value (one made
        /// before issue 36 with an empty auth, or by someone who removed the broker's).
        case foreign
    }

    /// Looks at the index: absent, the broker's counter (with its value), or another.
    public func counterState(index: UInt32, auth: UnsafeRawBufferPointer) throws(TPMError) -> CounterState {
        guard let nv = try counterHandle(index) else { return .absent }
        guard try isCounterDefinition(nv) else { return .foreign }
        try setAuth(nv, auth)
        do throws(TPMError) { return .ours(try read(nv)) } catch {
            if Self.isAuthFailure(error) { return .foreign }
            throw error
        }
    }

    /// A counter made before issue 36 (empty auth value): its value, or nil when the index is
    /// absent, never incremented or does not answer to an empty auth.
    public func legacyCounterValue(index: UInt32) throws(TPMError) -> UInt64? {
        guard let nv = try counterHandle(index) else { return nil }
        do throws(TPMError) { return try read(nv) } catch {
            if Self.isAuthFailure(error) { return nil }
            throw error
        }
    }

    /// Increments the broker's counter and returns the new value.
    public func incrementCounter(index: UInt32, auth: UnsafeRawBufferPointer) throws(TPMError) -> UInt64 {
        guard let nv = try counterHandle(index) else { throw .unexpectedResponse }
        try setAuth(nv, auth)
        try Esys_NV_Increment(ctx, nv, nv, ESYS_TR(ESYS_TR_PASSWORD), ESYS_TR(ESYS_TR_NONE), ESYS_TR(ESYS_TR_NONE)).check("NV_Increment")
        guard let value = try read(nv) else { throw .unexpectedResponse }
        return value
    }

    /// Removes whatever is at `index` (the owner hierarchy's authorization); absent is fine.
    public func undefineCounter(index: UInt32) throws(TPMError) {
        guard let nv = try counterHandle(index) else { return }
        try Esys_NV_UndefineSpace(ctx, ESYS_TR(ESYS_TR_RH_OWNER), nv, ESYS_TR(ESYS_TR_PASSWORD), ESYS_TR(ESYS_TR_NONE),
                                  ESYS_TR(ESYS_TR_NONE)).check("NV_UndefineSpace")
    }

    /// Defines the broker's counter at `index` with `auth` (owner hierarchy; the auth value
    /// travels encrypted in a session salted with the storage primary key), increments it once
    /// (a new counter starts at the highest value any counter on this TPM had) and returns it.
    public func defineCounter(index: UInt32, auth: UnsafeRawBufferPointer) throws(TPMError) -> UInt64 {
        guard auth.count > 0, auth.count <= 32 else { throw .authTooLong }
        var info = TPM2B_NV_PUBLIC()
        info.nvPublic.nvIndex = index
        info.nvPublic.nameAlg = TPM2_ALG_SHA256
        info.nvPublic.attributes = Self.counterAttributes
        info.nvPublic.dataSize = 8
        var value = TPM2B_AUTH()
        value.size = UInt16(auth.count)
        withUnsafeMutableBytes(of: &value.buffer) { $0.copyMemory(from: auth) }
        defer { withUnsafeMutableBytes(of: &value) { zero($0) } }
        var nv = ESYS_TR(ESYS_TR_NONE)
        do {
            let primary = try createPrimary()
            defer { flush(primary) }
            let session = try startSession(primary: primary, type: UInt8(TPM2_SE_HMAC))
            defer { flush(session) }
            try Esys_TRSess_SetAttributes(ctx, session, sessionAttributes(decrypt: true), 0xFF).check("TRSess_SetAttributes")
            try Esys_NV_DefineSpace(ctx, ESYS_TR(ESYS_TR_RH_OWNER), session, ESYS_TR(ESYS_TR_NONE), ESYS_TR(ESYS_TR_NONE),
                                    &value, &info, &nv).check("NV_DefineSpace")
        }
        return try incrementCounter(index: index, auth: auth)
    }

    // MARK: Pieces

    private func counterHandle(_ index: UInt32) throws(TPMError) -> ESYS_TR? {
        var nv = ESYS_TR(ESYS_TR_NONE)
        let rc = Esys_TR_FromTPMPublic(ctx, index, ESYS_TR(ESYS_TR_NONE), ESYS_TR(ESYS_TR_NONE), ESYS_TR(ESYS_TR_NONE), &nv)
        // TPM_RC_HANDLE (format one, any handle number): no such index.
        if rc & 0x80 != 0 && rc & 0x3F == 0x0B && rc & 0xFF_0000 == 0 { return nil }
        try rc.check("TR_FromTPMPublic")
        return nv
    }

    /// Whether the index's public area is the broker's definition (type, attributes, size, no
    /// policy). Necessary, not sufficient: anyone who may define indices can copy it; the auth
    /// value, which the public area does not show, is what tells them apart.
    private func isCounterDefinition(_ nv: ESYS_TR) throws(TPMError) -> Bool {
        var pub: UnsafeMutablePointer<TPM2B_NV_PUBLIC>?
        var name: UnsafeMutablePointer<TPM2B_NAME>?
        try Esys_NV_ReadPublic(ctx, nv, ESYS_TR(ESYS_TR_NONE), ESYS_TR(ESYS_TR_NONE), ESYS_TR(ESYS_TR_NONE), &pub, &name).check("NV_ReadPublic")
        defer { Esys_Free(pub); Esys_Free(name) }
        guard let p = pub?.pointee.nvPublic else { throw .unexpectedResponse }
        return p.attributes & ~Self.stateAttributes == Self.counterAttributes && p.dataSize == 8
            && p.nameAlg == TPM2_ALG_SHA256 && p.authPolicy.size == 0
    }

    /// The value (nil when never incremented), read with the auth value set on `nv`.
    private func read(_ nv: ESYS_TR) throws(TPMError) -> UInt64? {
        var data: UnsafeMutablePointer<TPM2B_MAX_NV_BUFFER>?
        let rc = Esys_NV_Read(ctx, nv, nv, ESYS_TR(ESYS_TR_PASSWORD), ESYS_TR(ESYS_TR_NONE), ESYS_TR(ESYS_TR_NONE), 8, 0, &data)
        defer { Esys_Free(data) }
        if rc & 0xFFF == 0x14A /* NV_UNINITIALIZED */ { return nil }
        try rc.check("NV_Read")
        guard let data, data.pointee.size == 8 else { throw .unexpectedResponse }
        return withUnsafeBytes(of: data.pointee.buffer) { b in (0..<8).reduce(UInt64(0)) { $0 << 8 | UInt64(b[$1]) } }
    }

    /// The index refused the auth value (BAD_AUTH, AUTH_FAIL, or NV_AUTHORIZATION: no read or
    /// write with an auth value at all).
    static func isAuthFailure(_ error: TPMError) -> Bool {
        let code: UInt32
        switch error {
        case .command(_, let c), .sealedElsewhere(let c), .pcrMismatch(let c): code = c
        default: return false
        }
        guard code & 0xFF_0000 == 0 else { return false }
        if code & 0x80 != 0 { return [0x0E, 0x22].contains(code & 0x3F) }
        return code & 0xFFF == 0x149
    }
}
