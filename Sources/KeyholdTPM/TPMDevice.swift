import CTSS2
import Glibc

/// One short connection to a TPM through the TSS's ESAPI. Opened for one job and closed
/// again: a resource manager shares the TPM, but swtpm's socket server and a raw device
/// serve one client at a time, so the broker never holds the TPM while it serves.
///
/// Not thread-safe; used from one thread and then dropped.
public final class TPMDevice {
    private var tcti: OpaquePointer?
    var ctx: OpaquePointer?

    /// The kernel's resource manager. Tests pass `swtpm:path=SOCKET`.
    public static let defaultTCTI = "device:/dev/tpmrm0"

    /// Connects through the TCTI named by `conf` ("device:/dev/tpmrm0", "tabrmd", "swtpm:path=S").
    /// `ownerAuth`: the owner hierarchy's authorization when it has one (the storage primary
    /// key and the rollback counter's definition are made under it); nil for an empty one.
    public init(tcti conf: String, ownerAuth: UnsafeRawBufferPointer? = nil) throws(TPMError) {
        // The TSS logs failures to stderr on its own; Keyhold reports them once, in its words
        // (with the TSS's decoded response code). An administrator's TSS2_LOG still wins.
        setenv("TSS2_LOG", "all+NONE", 0)
        var t: OpaquePointer?
        let rc = conf.withCString { Tss2_TctiLdr_Initialize($0, &t) }
        guard rc == 0, let t else { throw TPMError.unavailable(code: rc) }
        tcti = t
        var c: OpaquePointer?
        let erc = Esys_Initialize(&c, t, nil)
        guard erc == 0, let c else {
            Tss2_TctiLdr_Finalize(&tcti)
            throw TPMError.classify(erc, command: "Initialize")
        }
        ctx = c
        if let ownerAuth { try setAuth(ESYS_TR(ESYS_TR_RH_OWNER), ownerAuth) }
        // A TPM that stops answering (a busy single-client simulator, a wedged device) must
        // fail the command, not hang the broker's start.
        _ = Esys_SetTimeout(c, TPMDevice.timeoutMilliseconds)
    }

    /// Bound on one TPM command; real TPMs answer in well under a second, key creation included.
    public static let timeoutMilliseconds: Int32 = 20_000

    deinit {
        if ctx != nil { Esys_Finalize(&ctx) }
        if tcti != nil { Tss2_TctiLdr_Finalize(&tcti) }
    }

    // MARK: Sealing

    /// Seals `secret` (at most 128 bytes) under the storage hierarchy's primary key, optionally
    /// bound to the current values of the SHA-256 `pcrs`. The secret travels to the TPM
    /// encrypted by a session salted with the primary key.
    public func seal(_ secret: UnsafeRawBufferPointer, pcrs: PCRSelection) throws(TPMError) -> SealedKeyBlob {
        guard secret.count > 0, secret.count <= 128 else { throw .blobMalformed }
        let primary = try createPrimary()
        defer { flush(primary) }
        let session = try startSession(primary: primary, type: UInt8(TPM2_SE_HMAC))
        defer { flush(session) }
        try Esys_TRSess_SetAttributes(ctx, session, sessionAttributes(decrypt: true), 0xFF).check("TRSess_SetAttributes")

        var template = TPM2B_PUBLIC()
        template.publicArea.type = TPM2_ALG_KEYEDHASH
        template.publicArea.nameAlg = TPM2_ALG_SHA256
        template.publicArea.objectAttributes = TPMA_OBJECT_FIXEDTPM | TPMA_OBJECT_FIXEDPARENT | TPMA_OBJECT_NODA
        template.publicArea.parameters.keyedHashDetail.scheme.scheme = TPM2_ALG_NULL
        if pcrs.isEmpty {
            template.publicArea.objectAttributes |= TPMA_OBJECT_USERWITHAUTH
        } else {
            // Only a policy session that proved the PCR values may unseal (no auth value path).
            template.publicArea.authPolicy = try trialPolicyDigest(pcrs)
        }

        var sensitive = TPM2B_SENSITIVE_CREATE()
        sensitive.sensitive.data.size = UInt16(secret.count)
        withUnsafeMutableBytes(of: &sensitive.sensitive.data.buffer) { $0.copyMemory(from: secret) }
        defer { withUnsafeMutableBytes(of: &sensitive) { zero($0) } }

        var outsideInfo = TPM2B_DATA()
        var creationPCR = TPML_PCR_SELECTION()
        var outPrivate: UnsafeMutablePointer<TPM2B_PRIVATE>?
        var outPublic: UnsafeMutablePointer<TPM2B_PUBLIC>?
        var creationData: UnsafeMutablePointer<TPM2B_CREATION_DATA>?
        var creationHash: UnsafeMutablePointer<TPM2B_DIGEST>?
        var ticket: UnsafeMutablePointer<TPMT_TK_CREATION>?
        try Esys_Create(ctx, primary, session, ESYS_TR(ESYS_TR_NONE), ESYS_TR(ESYS_TR_NONE), &sensitive, &template,
                        &outsideInfo, &creationPCR, &outPrivate, &outPublic, &creationData, &creationHash, &ticket).check("Create")
        defer {
            Esys_Free(outPrivate); Esys_Free(outPublic); Esys_Free(creationData); Esys_Free(creationHash); Esys_Free(ticket)
        }
        guard let outPrivate, let outPublic else { throw .unexpectedResponse }
        return try SealedKeyBlob(pcrs: pcrs, public: outPublic.pointee, private: outPrivate.pointee)
    }

    /// Loads `blob` under this TPM's primary key and unseals it; `body` sees the secret, which
    /// is wiped from the TSS's buffer afterwards. Fails with `.sealedElsewhere` on another TPM
    /// or after a clear, `.pcrMismatch` when bound PCRs changed.
    public func unseal<R>(_ blob: SealedKeyBlob, _ body: (UnsafeRawBufferPointer) -> R) throws(TPMError) -> R {
        let primary = try createPrimary()
        defer { flush(primary) }
        var pub = try blob.tpmPublic()
        var priv = try blob.tpmPrivate()
        var object = ESYS_TR(ESYS_TR_NONE)
        try Esys_Load(ctx, primary, ESYS_TR(ESYS_TR_PASSWORD), ESYS_TR(ESYS_TR_NONE), ESYS_TR(ESYS_TR_NONE),
                      &priv, &pub, &object).check("Load")
        defer { flush(object) }

        let session = try startSession(primary: primary, type: UInt8(blob.pcrs.isEmpty ? TPM2_SE_HMAC : TPM2_SE_POLICY))
        defer { flush(session) }
        if !blob.pcrs.isEmpty {
            var none = TPM2B_DIGEST()
            var selection = blob.pcrs.tpmSelection
            try Esys_PolicyPCR(ctx, session, ESYS_TR(ESYS_TR_NONE), ESYS_TR(ESYS_TR_NONE), ESYS_TR(ESYS_TR_NONE),
                               &none, &selection).check("PolicyPCR")
        }
        try Esys_TRSess_SetAttributes(ctx, session, sessionAttributes(decrypt: false), 0xFF).check("TRSess_SetAttributes")

        var out: UnsafeMutablePointer<TPM2B_SENSITIVE_DATA>?
        try Esys_Unseal(ctx, object, session, ESYS_TR(ESYS_TR_NONE), ESYS_TR(ESYS_TR_NONE), &out).check("Unseal")
        guard let out else { throw .unexpectedResponse }
        defer {
            withUnsafeMutableBytes(of: &out.pointee) { zero($0) }
            Esys_Free(out)
        }
        let size = Int(out.pointee.size)
        guard size > 0, size <= MemoryLayout.size(ofValue: out.pointee.buffer) else { throw .unexpectedResponse }
        return withUnsafeBytes(of: &out.pointee.buffer) { body(UnsafeRawBufferPointer(rebasing: $0[0..<size])) }
    }

    // MARK: Pieces

    /// The authorization ESAPI uses for `handle` from now on (copied; the copy is wiped).
    func setAuth(_ handle: ESYS_TR, _ value: UnsafeRawBufferPointer) throws(TPMError) {
        guard value.count <= MemoryLayout<TPMU_HA>.size else { throw .authTooLong }
        var auth = TPM2B_AUTH()
        auth.size = UInt16(value.count)
        withUnsafeMutableBytes(of: &auth.buffer) { $0.copyMemory(from: value) }
        defer { withUnsafeMutableBytes(of: &auth) { zero($0) } }
        try Esys_TR_SetAuth(ctx, handle, &auth).check("TR_SetAuth")
    }

    /// The storage hierarchy's ECC P-256 primary key from the standard SRK template: the same
    /// template gives the same key on the same TPM until its owner seed changes (a clear).
    func createPrimary() throws(TPMError) -> ESYS_TR {
        var template = TPM2B_PUBLIC()
        template.publicArea.type = TPM2_ALG_ECC
        template.publicArea.nameAlg = TPM2_ALG_SHA256
        template.publicArea.objectAttributes = TPMA_OBJECT_FIXEDTPM | TPMA_OBJECT_FIXEDPARENT | TPMA_OBJECT_SENSITIVEDATAORIGIN
            | TPMA_OBJECT_USERWITHAUTH | TPMA_OBJECT_RESTRICTED | TPMA_OBJECT_DECRYPT | TPMA_OBJECT_NODA
        template.publicArea.parameters.eccDetail.symmetric.algorithm = TPM2_ALG_AES
        template.publicArea.parameters.eccDetail.symmetric.keyBits.aes = 128
        template.publicArea.parameters.eccDetail.symmetric.mode.aes = TPM2_ALG_CFB
        template.publicArea.parameters.eccDetail.scheme.scheme = TPM2_ALG_NULL
        template.publicArea.parameters.eccDetail.curveID = TPM2_ECC_NIST_P256
        template.publicArea.parameters.eccDetail.kdf.scheme = TPM2_ALG_NULL
        var sensitive = TPM2B_SENSITIVE_CREATE()
        var outsideInfo = TPM2B_DATA()
        var creationPCR = TPML_PCR_SELECTION()
        var handle = ESYS_TR(ESYS_TR_NONE)
        var outPublic: UnsafeMutablePointer<TPM2B_PUBLIC>?
        var creationData: UnsafeMutablePointer<TPM2B_CREATION_DATA>?
        var creationHash: UnsafeMutablePointer<TPM2B_DIGEST>?
        var ticket: UnsafeMutablePointer<TPMT_TK_CREATION>?
        try Esys_CreatePrimary(ctx, ESYS_TR(ESYS_TR_RH_OWNER), ESYS_TR(ESYS_TR_PASSWORD), ESYS_TR(ESYS_TR_NONE), ESYS_TR(ESYS_TR_NONE),
                               &sensitive, &template, &outsideInfo, &creationPCR,
                               &handle, &outPublic, &creationData, &creationHash, &ticket).check("CreatePrimary")
        Esys_Free(outPublic); Esys_Free(creationData); Esys_Free(creationHash); Esys_Free(ticket)
        return handle
    }

    /// A session salted with the primary key, so parameters can travel encrypted (AES-128 CFB).
    func startSession(primary: ESYS_TR, type: TPM2_SE) throws(TPMError) -> ESYS_TR {
        var symmetric = TPMT_SYM_DEF()
        symmetric.algorithm = TPM2_ALG_AES
        symmetric.keyBits.aes = 128
        symmetric.mode.aes = TPM2_ALG_CFB
        var session = ESYS_TR(ESYS_TR_NONE)
        try Esys_StartAuthSession(ctx, primary, ESYS_TR(ESYS_TR_NONE), ESYS_TR(ESYS_TR_NONE), ESYS_TR(ESYS_TR_NONE),
                                  ESYS_TR(ESYS_TR_NONE), nil, type, &symmetric, TPM2_ALG_SHA256, &session).check("StartAuthSession")
        return session
    }

    /// The policy digest of "PolicyPCR over `pcrs` at their current values", from a trial session.
    private func trialPolicyDigest(_ pcrs: PCRSelection) throws(TPMError) -> TPM2B_DIGEST {
        var symmetric = TPMT_SYM_DEF()
        symmetric.algorithm = TPM2_ALG_NULL
        var trial = ESYS_TR(ESYS_TR_NONE)
        try Esys_StartAuthSession(ctx, ESYS_TR(ESYS_TR_NONE), ESYS_TR(ESYS_TR_NONE), ESYS_TR(ESYS_TR_NONE), ESYS_TR(ESYS_TR_NONE),
                                  ESYS_TR(ESYS_TR_NONE), nil, UInt8(TPM2_SE_TRIAL), &symmetric, TPM2_ALG_SHA256, &trial).check("StartAuthSession")
        defer { flush(trial) }
        var none = TPM2B_DIGEST()
        var selection = pcrs.tpmSelection
        try Esys_PolicyPCR(ctx, trial, ESYS_TR(ESYS_TR_NONE), ESYS_TR(ESYS_TR_NONE), ESYS_TR(ESYS_TR_NONE), &none, &selection).check("PolicyPCR")
        var digest: UnsafeMutablePointer<TPM2B_DIGEST>?
        try Esys_PolicyGetDigest(ctx, trial, ESYS_TR(ESYS_TR_NONE), ESYS_TR(ESYS_TR_NONE), ESYS_TR(ESYS_TR_NONE), &digest).check("PolicyGetDigest")
        defer { Esys_Free(digest) }
        guard let digest, digest.pointee.size == 32 else { throw .unexpectedResponse }
        return digest.pointee
    }

    /// decrypt: the command's first parameter goes encrypted; else the response's comes back so.
    func sessionAttributes(decrypt: Bool) -> TPMA_SESSION {
        TPMA_SESSION(TPMA_SESSION_CONTINUESESSION) | TPMA_SESSION(decrypt ? TPMA_SESSION_DECRYPT : TPMA_SESSION_ENCRYPT)
    }

    func flush(_ handle: ESYS_TR) {
        if handle != ESYS_TR(ESYS_TR_NONE) { _ = Esys_FlushContext(ctx, handle) }
    }
}

/// Overwrites `bytes` with zeros in a way the optimiser keeps.
func zero(_ bytes: UnsafeMutableRawBufferPointer) {
    if let base = bytes.baseAddress { explicit_bzero(base, bytes.count) }
}
