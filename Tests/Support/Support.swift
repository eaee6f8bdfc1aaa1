// Test support shared by the test targets: fixtures that start real services.
