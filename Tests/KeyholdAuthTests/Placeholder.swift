import Testing

@Test func placeholder_KeyholdAuthTests() { #expect(Bool(true)) }
