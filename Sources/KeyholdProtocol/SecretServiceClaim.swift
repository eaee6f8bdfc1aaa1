extension Request {
    /// The claimed pid the Secret Service agent sends when the bus could not tell it who sent
    /// a call (the sender left first): no process has it (the kernel's pid_max is at most
    /// 2^22), and the broker refuses it by name, so such a call is refused and audited rather
    /// than carried out as the agent's own.
    public static let unreadableClaimedPID: Int32 = .max
}
