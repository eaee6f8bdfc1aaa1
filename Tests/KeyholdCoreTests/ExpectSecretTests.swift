import KeyholdTestSupport
import Testing

@Suite struct ExpectSecretTests {
    @Test func equalSecretsRecordNothing() {
        expectSecret("tok-1", equals: "tok-1")
        expectSecret([0, 255, 7] as [UInt8], equals: [0, 255, 7] as [UInt8])
        expectSecret("", equals: "")
        expectSecret(nil as String?, equals: nil)
    }

    /// Each mismatch, of strings and of bytes, is one issue that has the lengths and neither value.
    /// Not a parameterized test: Swift Testing would print the arguments.
    @Test func aMismatchNamesLengthsOnly() {
        let cases: [(String?, String?, String)] = [("hunter2", "correct horse", "7 bytes, expected 13 bytes"),
                                                   ("secret-a", "secret-b", "8 bytes, expected 8 bytes"),
                                                   ("secret-a", nil, "8 bytes, expected missing"),
                                                   (nil, "secret-b", "missing, expected 8 bytes")]
        for (actual, expected, lengths) in cases {
            let values = [actual, expected].compactMap { $0 }.flatMap { [$0, "\(Array($0.utf8))"] }
            let lengthsOnly: KnownIssueMatcher = { issue in
                issue.description.contains("the secret differs: \(lengths)") && !values.contains { issue.description.contains($0) }
            }
            withKnownIssue { expectSecret(actual, equals: expected, "stderr: x") } matching: {
                lengthsOnly($0) && $0.description.contains("\(lengths): stderr: x")
            }
            withKnownIssue { expectSecret(actual.map { Array($0.utf8) }, equals: expected.map { Array($0.utf8) }) } matching: {
                lengthsOnly($0)
            }
        }
    }
}
