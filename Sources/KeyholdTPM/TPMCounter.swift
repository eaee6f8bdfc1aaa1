import CTSS2

/// A TPM NV counter (TPM2_NT_COUNTER): the TPM only ever lets it grow, and it survives
/// restoring any file. The broker keeps one per vault for rollback detection.
///
/// Wear: each increment is an NV write. The broker increments only for changes that matter
/// for rollback (delete, update, audit prune, a denied attempt), not for reads.
extension TPMDevice {
    /// The NV index for a vault: owner range 0x01xxxxxx, "KH" then 16 bits of `vaultTag`, so
    /// two vaults on one machine do not share a counter.
    public static func counterIndex(vaultTag: UInt16) -> UInt32 { 0x014B_0000 | UInt32(vaultTag) }

    /// The counter's value, or nil when the index is not defined (or never incremented).
    public func readCounter(index: UInt32) throws(TPMError) -> UInt64? {
        guard let nv = try counterHandle(index) else { return nil }
        var data: UnsafeMutablePointer<TPM2B_MAX_NV_BUFFER>?
        let rc = Esys_NV_Read(ctx, nv, nv, ESYS_TR(ESYS_TR_PASSWORD), ESYS_TR(ESYS_TR_NONE), ESYS_TR(ESYS_TR_NONE), 8, 0, &data)
        defer { Esys_Free(data) }
        if rc & 0xFFF == 0x14A /* NV_UNINITIALIZED */ { return nil }
        try rc.check("NV_Read")
        guard let data, data.pointee.size == 8 else { throw .unexpectedResponse }
        return withUnsafeBytes(of: data.pointee.buffer) { b in (0..<8).reduce(UInt64(0)) { $0 << 8 | UInt64(b[$1]) } }
    }

    /// Increments the counter (defining it first if needed) and returns the new value.
    public func incrementCounter(index: UInt32) throws(TPMError) -> UInt64 {
        var nv: ESYS_TR
        if let existing = try counterHandle(index) { nv = existing } else { nv = try defineCounter(index) }
        try Esys_NV_Increment(ctx, nv, nv, ESYS_TR(ESYS_TR_PASSWORD), ESYS_TR(ESYS_TR_NONE), ESYS_TR(ESYS_TR_NONE)).check("NV_Increment")
        guard let value = try readCounter(index: index) else { throw .unexpectedResponse }
        return value
    }

    private func counterHandle(_ index: UInt32) throws(TPMError) -> ESYS_TR? {
        var nv = ESYS_TR(ESYS_TR_NONE)
        let rc = Esys_TR_FromTPMPublic(ctx, index, ESYS_TR(ESYS_TR_NONE), ESYS_TR(ESYS_TR_NONE), ESYS_TR(ESYS_TR_NONE), &nv)
        // TPM_RC_HANDLE (format one, any handle number): no such index.
        if rc & 0x80 != 0 && rc & 0x3F == 0x0B && rc & 0xFF_0000 == 0 { return nil }
        try rc.check("TR_FromTPMPublic")
        return nv
    }

    /// Owner hierarchy (empty owner auth, as a fresh TPM has); readable and incrementable with
    /// the index's empty auth, no dictionary-attack lockout. Only growing is possible.
    private func defineCounter(_ index: UInt32) throws(TPMError) -> ESYS_TR {
        var info = TPM2B_NV_PUBLIC()
        info.nvPublic.nvIndex = index
        info.nvPublic.nameAlg = TPM2_ALG_SHA256
        info.nvPublic.attributes = (TPMA_NV(TPM2_NT_COUNTER) << TPMA_NV(TPMA_NV_TPM2_NT_SHIFT))
            | TPMA_NV_AUTHWRITE | TPMA_NV_AUTHREAD | TPMA_NV_NO_DA
        info.nvPublic.dataSize = 8
        var auth = TPM2B_AUTH()
        var nv = ESYS_TR(ESYS_TR_NONE)
        try Esys_NV_DefineSpace(ctx, ESYS_TR(ESYS_TR_RH_OWNER), ESYS_TR(ESYS_TR_PASSWORD), ESYS_TR(ESYS_TR_NONE), ESYS_TR(ESYS_TR_NONE),
                                &auth, &info, &nv).check("NV_DefineSpace")
        return nv
    }
}
