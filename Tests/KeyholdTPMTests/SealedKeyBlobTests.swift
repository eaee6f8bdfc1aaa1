import Foundation
import Testing
import KeyholdTPM
import KeyholdTestSupport

/// The sealed-key file is the one place Keyhold parses TPM-made bytes, and anyone who can
/// write the state directory can put anything there: hostile encodings must be refused
/// before the TPM sees them, and an altered blob must never open (to any key).
@Suite(.serialized, .timeLimit(.minutes(5))) struct SealedKeyBlobTests {
    let key = (0..<32).map { UInt8($0 &* 7 &+ 3) }

    func seal(_ tpm: SoftwareTPM, pcrs: PCRSelection = .none) throws -> SealedKeyBlob {
        let device = try TPMDevice(tcti: tpm.tcti)
        return try key.withUnsafeBytes { (raw) throws(TPMError) in try device.seal(raw, pcrs: pcrs) }
    }

    func unseal(_ tpm: SoftwareTPM, _ blob: SealedKeyBlob) throws(TPMError) -> [UInt8] {
        try TPMDevice(tcti: tpm.tcti).unseal(blob) { Array($0) }
    }

    @Test func roundTripOnTheSameTPMOnly() throws {
        let tpm = try SoftwareTPM()
        let blob = try seal(tpm)
        #expect(try SealedKeyBlob(encoded: blob.encoded) == blob)
        expectSecret(try unseal(tpm, SealedKeyBlob(encoded: blob.encoded)), equals: key)
        // No byte run of the key in the blob (the private part is encrypted by the TPM).
        let enc = blob.encoded
        for i in 0...(key.count - 8) {
            let window = Array(key[i..<i + 8])
            #expect(!(0...(enc.count - 8)).contains { Array(enc[$0..<$0 + 8]) == window })
        }
        let other = try SoftwareTPM()
        #expect { try unseal(other, blob) } throws: { e in
            if case .sealedElsewhere = e as? TPMError { return true } else { return false }
        }
    }

    @Test func hostileEncodingsAreRefusedBeforeTheTPM() throws {
        let tpm = try SoftwareTPM()
        let good = try seal(tpm).encoded
        var cases: [[UInt8]] = [[], Array("KHTPMKEY".utf8), Array(good.dropLast()), good + [0],
                                Array(good.dropFirst()), [UInt8](repeating: 0xFF, count: 300)]
        // Every truncation.
        for n in stride(from: 0, to: good.count, by: 1) { cases.append(Array(good[0..<n])) }
        // Wrong version, absurd PCR counts and lists, absurd field lengths.
        var v = good; v[8] = 2; cases.append(v)
        var c = good; c[9] = 200; cases.append(c)
        var lenHuge = good; lenHuge[10] = 0xFF; lenHuge[11] = 0xFF; cases.append(lenHuge)
        var pcrs = Array(good[0..<9]) + [2, 7, 3] + Array(good[10...]); cases.append(pcrs)
        pcrs = Array(good[0..<9]) + [1, 30] + Array(good[10...]); cases.append(pcrs)
        for bytes in cases {
            #expect(throws: TPMError.blobMalformed) { try SealedKeyBlob(encoded: bytes) }
        }
        // Random bytes and random mutations never crash the parser.
        var rng = SystemRandomNumberGenerator()
        for _ in 0..<3000 {
            var m = good
            for _ in 0..<Int.random(in: 1...4, using: &rng) { m[Int.random(in: 0..<m.count, using: &rng)] = UInt8.random(in: 0...255, using: &rng) }
            _ = try? SealedKeyBlob(encoded: m)
            _ = try? SealedKeyBlob(encoded: (0..<Int.random(in: 0...400, using: &rng)).map { _ in UInt8.random(in: 0...255, using: &rng) })
        }
    }

    /// Every single-byte change of a real blob either fails to parse or fails in the TPM;
    /// none opens, to the key or to anything else.
    @Test func everyAlteredByteFailsToOpen() throws {
        let tpm = try SoftwareTPM()
        let good = try seal(tpm).encoded
        var parsedButRefused = 0
        for i in 0..<good.count {
            var m = good
            m[i] ^= 0x01
            guard let blob = try? SealedKeyBlob(encoded: m) else { continue }
            parsedButRefused += 1
            #expect(throws: TPMError.self, "byte \(i)") { try unseal(tpm, blob) }
        }
        #expect(parsedButRefused > 0)
    }

    /// Bound to PCR 16: opens while it is unchanged, fails as a PCR mismatch once extended.
    @Test func pcrBindingFailsAfterAMeasurementChanges() throws {
        let tpm = try SoftwareTPM()
        let blob = try seal(tpm, pcrs: PCRSelection(list: "16")!)
        #expect(blob.pcrs.indices == [16])
        expectSecret(try unseal(tpm, SealedKeyBlob(encoded: blob.encoded)), equals: key)
        try tpm.extendPCR(16)
        #expect { try unseal(tpm, blob) } throws: { e in
            if case .pcrMismatch = e as? TPMError { return true } else { return false }
        }
    }

    @Test func pcrListParsing() {
        #expect(PCRSelection(list: "0,7")?.indices == [0, 7])
        #expect(PCRSelection(list: "7,0")?.indices == [0, 7])
        for bad in ["", "24", "1,1", "a", "1,,2", "-1", "0x1"] { #expect(PCRSelection(list: bad) == nil, "\(bad)") }
    }
}
