extension BiometryStore {
    /// Always nil: the root broker keeps no D-Bus client; `keyhold biometry` asks fprintd for
    /// the reader's name itself, as the user (KeyholdCLI/BiometryReader.swift). Kept only for
    /// the broker's one caller until the session code is split; delete with that call.
    public static func readerDescription() -> String? { nil }
}
