import KeyholdCore
@testable import KeyholdVault
import KeyholdTestSupport
import Testing

/// The recovery key's written form and its wrap of the vault key (issue 39 item 1).
@Suite struct RecoveryKeyTests {
    func text(_ b: SecureBytes) -> String { b.withUnsafeBytes { String(decoding: $0, as: UTF8.self) } }

    @Test func writtenFormReadsBackWhateverTheCaseAndSpacing() throws {
        let key = RecoveryKey.generate()
        let written = text(key.writtenForm)
        #expect(written.count == 14 * 4 + 13 && written.split(separator: "-").count == 14)
        for variant in [written, written.lowercased(), written.replacingOccurrences(of: "-", with: " "),
                        written.replacingOccurrences(of: "-", with: "")] {
            let back = try #require(RecoveryKey(written: SecureBytes(copying: Array(variant.utf8))))
            #expect(back.identity == key.identity)
        }
        #expect(RecoveryKey.generate().identity != key.identity)
    }

    @Test func everyMistypedCharacterIsCaught() {
        let written = Array(text(RecoveryKey.generate().writtenForm).utf8)
        let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567".utf8)
        // Each position, changed to another base32 character: the checksum refuses it.
        for (i, c) in written.enumerated() where c != UInt8(ascii: "-") {
            var typo = written
            typo[i] = alphabet[(alphabet.firstIndex(of: c)! + 1 + i % 31) % 32]
            #expect(RecoveryKey(written: SecureBytes(copying: typo)) == nil, "position \(i)")
        }
        // Too short, too long, not base32.
        #expect(RecoveryKey(written: SecureBytes(copying: Array(written.dropLast()))) == nil)
        #expect(RecoveryKey(written: SecureBytes(copying: written + Array("A".utf8))) == nil)
        #expect(RecoveryKey(written: SecureBytes(copying: Array(written.dropLast()) + [UInt8(ascii: "1")])) == nil)
        #expect(RecoveryKey(written: SecureBytes(copying: [])) == nil)
    }

    @Test func onlyItsOwnRecoveryKeyUnwrapsTheVaultKey() throws {
        let vault = VaultKey.generate(), recovery = RecoveryKey.generate()
        let wrap = recovery.wrap(vault)
        #expect(VaultStore.sameKey(try recovery.unwrap(wrap), vault))
        #expect(throws: CryptoError.authenticationFailed) { try RecoveryKey.generate().unwrap(wrap) }
        var altered = wrap.combined
        altered[altered.count / 2] ^= 1
        #expect(throws: CryptoError.authenticationFailed) { try recovery.unwrap(try SealedBox(combined: altered)) }
    }
}
