import Testing

@Test func placeholder_KeyholdCoreTests() { #expect(Bool(true)) }
