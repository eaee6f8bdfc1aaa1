import Testing

@Test func placeholder_KeyholdIntegrationTests() { #expect(Bool(true)) }
