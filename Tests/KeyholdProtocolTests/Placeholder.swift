import Testing

@Test func placeholder_KeyholdProtocolTests() { #expect(Bool(true)) }
