import Testing
@testable import KeyholdCore

/// Recycled secure regions: a buffer handed out again never shows an earlier buffer's bytes,
/// whatever its size relative to the one that used the region before.
@Suite struct SecureRegionPoolTests {
    @Test func reusedRegionsComeBackZeroed() {
        for size in [1, 7, 63, 64, 65, 200, 4000, 4096, 5000, 70_000] {
            // Fill buffers of the same and larger sizes of this class, drop them, take again.
            for fill in [size, min(size * 2, 65_536), max(size / 2, 1)] {
                let used = (0..<8).map { _ in SecureBytes(count: fill) }
                for b in used { b.withUnsafeMutableBytes { for i in $0.indices { $0[i] = 0xA5 } } }
            }
            for _ in 0..<8 {
                let fresh = SecureBytes(count: size)
                #expect(fresh.count == size)
                fresh.withUnsafeBytes { #expect($0.allSatisfy { $0 == 0 }) }
            }
        }
    }

    @Test func buffersTakenTogetherDoNotOverlap() {
        let held = (0..<100).map { i in SecureBytes(copying: [UInt8](repeating: UInt8(i), count: 100)) }
        for (i, b) in held.enumerated() { b.withUnsafeBytes { #expect($0.allSatisfy { $0 == UInt8(i) }) } }
    }
}
