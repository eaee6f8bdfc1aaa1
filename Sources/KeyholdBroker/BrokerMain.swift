// STUB — replaced by the broker work.
public enum BrokerMain {
    public static func run(arguments: [String]) -> Never {
        fatalError("broker not built yet")
    }
}
