import CTSS2

/// A set of SHA-256 PCR indices (0...23) a sealed key is bound to; empty means "not bound".
public struct PCRSelection: Sendable, Equatable, CustomStringConvertible {
    public let indices: [UInt8]

    public static let none = PCRSelection(validated: [])

    private init(validated: [UInt8]) { indices = validated }

    /// Parses "0,2,7" (what `--tpm-pcrs` takes); nil for anything else.
    public init?(list: String) {
        var seen: [UInt8] = []
        for part in list.split(separator: ",", omittingEmptySubsequences: false) {
            guard let n = UInt8(part), n < 24, !seen.contains(n) else { return nil }
            seen.append(n)
        }
        guard !seen.isEmpty else { return nil }
        indices = seen.sorted()
    }

    /// From a blob's bytes: strictly increasing, each below 24.
    init?(indices: [UInt8]) {
        guard indices.count <= 24, zip(indices, indices.dropFirst()).allSatisfy({ $0 < $1 }), indices.allSatisfy({ $0 < 24 })
        else { return nil }
        self.indices = indices
    }

    public var isEmpty: Bool { indices.isEmpty }
    public var description: String { isEmpty ? "none" : indices.map(String.init).joined(separator: ",") }

    var tpmSelection: TPML_PCR_SELECTION {
        var list = TPML_PCR_SELECTION()
        list.count = 1
        list.pcrSelections.0.hash = TPM2_ALG_SHA256
        list.pcrSelections.0.sizeofSelect = 3
        withUnsafeMutableBytes(of: &list.pcrSelections.0.pcrSelect) { bits in
            for i in indices { bits[Int(i) / 8] |= 1 << (i % 8) }
        }
        return list
    }
}

/// The sealed vault key as written to the state directory: the TPM's public and (encrypted)
/// private parts of a sealed-data object, plus the PCRs it is bound to. Nothing in it opens
/// without the TPM that made it.
///
/// File format (all integers big-endian):
///   "KHTPMKEY" | version u8 = 1 | pcr count u8 | pcr indices | u16 len | TPM2B_PUBLIC bytes
///   | u16 len | TPM2B_PRIVATE bytes
/// This is the one parser of TPM-made bytes in Keyhold (the file can be altered by anyone who
/// can write the state directory); TPM structures are decoded by the TSS's own unmarshallers
/// and must consume their field exactly.
public struct SealedKeyBlob: Sendable, Equatable {
    static let magic = Array("KHTPMKEY".utf8)
    static let version: UInt8 = 1
    /// Well above what a TPM2B_PUBLIC/TPM2B_PRIVATE can be; refuses absurd lengths early.
    static let maxField = 1024

    public let pcrs: PCRSelection
    let publicBytes: [UInt8]
    let privateBytes: [UInt8]

    init(pcrs: PCRSelection, public pub: TPM2B_PUBLIC, private priv: TPM2B_PRIVATE) throws(TPMError) {
        self.pcrs = pcrs
        publicBytes = try Self.marshal(pub, Tss2_MU_TPM2B_PUBLIC_Marshal)
        privateBytes = try Self.marshal(priv, Tss2_MU_TPM2B_PRIVATE_Marshal)
    }

    public var encoded: [UInt8] {
        var out = Self.magic
        out.append(Self.version)
        out.append(UInt8(pcrs.indices.count))
        out += pcrs.indices
        for field in [publicBytes, privateBytes] {
            out.append(UInt8(field.count >> 8)); out.append(UInt8(field.count & 0xFF))
            out += field
        }
        return out
    }

    public init(encoded bytes: [UInt8]) throws(TPMError) {
        var at = 0
        func take(_ n: Int) throws(TPMError) -> ArraySlice<UInt8> {
            guard n >= 0, n <= bytes.count - at else { throw .blobMalformed }
            defer { at += n }
            return bytes[at..<at + n]
        }
        guard try Array(take(Self.magic.count)) == Self.magic, try take(1).first == Self.version else { throw .blobMalformed }
        let count = Int(try take(1).first!)
        guard let pcrs = PCRSelection(indices: Array(try take(count))) else { throw .blobMalformed }
        func field() throws(TPMError) -> [UInt8] {
            let len = try take(2)
            let n = Int(len.first!) << 8 | Int(len.last!)
            guard n > 2, n <= Self.maxField else { throw .blobMalformed }
            return Array(try take(n))
        }
        let pub = try field()
        let priv = try field()
        guard at == bytes.count else { throw .blobMalformed }
        self.pcrs = pcrs
        publicBytes = pub
        privateBytes = priv
        // Both must decode as TPM structures now, not first inside the TPM.
        let decoded = try tpmPublic()
        _ = try tpmPrivate()
        // A sealed-data object (keyed hash, no scheme): anything else is not a Keyhold key.
        guard decoded.publicArea.type == TPM2_ALG_KEYEDHASH,
              decoded.publicArea.objectAttributes & TPMA_OBJECT_FIXEDTPM != 0,
              decoded.publicArea.objectAttributes & TPMA_OBJECT_SENSITIVEDATAORIGIN == 0,
              pcrs.isEmpty == (decoded.publicArea.authPolicy.size == 0)
        else { throw .blobMalformed }
    }

    func tpmPublic() throws(TPMError) -> TPM2B_PUBLIC { try Self.unmarshal(publicBytes, Tss2_MU_TPM2B_PUBLIC_Unmarshal) }
    func tpmPrivate() throws(TPMError) -> TPM2B_PRIVATE { try Self.unmarshal(privateBytes, Tss2_MU_TPM2B_PRIVATE_Unmarshal) }

    typealias Marshal<T> = (UnsafePointer<T>?, UnsafeMutablePointer<UInt8>?, Int, UnsafeMutablePointer<Int>?) -> TSS2_RC
    typealias Unmarshal<T> = (UnsafePointer<UInt8>?, Int, UnsafeMutablePointer<Int>?, UnsafeMutablePointer<T>?) -> TSS2_RC

    static func marshal<T>(_ value: T, _ f: Marshal<T>) throws(TPMError) -> [UInt8] {
        var v = value
        var out = [UInt8](repeating: 0, count: maxField)
        var offset = 0
        let rc = out.withUnsafeMutableBufferPointer { f(&v, $0.baseAddress, $0.count, &offset) }
        guard rc == 0, offset > 2 else { throw .unexpectedResponse }
        return Array(out[0..<offset])
    }

    /// Decodes `bytes` as one T; the whole buffer must be consumed.
    static func unmarshal<T>(_ bytes: [UInt8], _ f: Unmarshal<T>) throws(TPMError) -> T {
        let out = UnsafeMutablePointer<T>.allocate(capacity: 1)
        defer { out.deallocate() }
        UnsafeMutableRawPointer(out).initializeMemory(as: UInt8.self, repeating: 0, count: MemoryLayout<T>.size)
        var offset = 0
        let rc = bytes.withUnsafeBufferPointer { f($0.baseAddress, $0.count, &offset, out) }
        guard rc == 0, offset == bytes.count else { throw .blobMalformed }
        return out.pointee
    }
}
