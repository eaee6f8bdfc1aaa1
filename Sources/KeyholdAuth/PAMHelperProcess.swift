// STUB — replaced by the KeyholdAuth work. The keyholdd binary re-executes itself as
// `keyholdd --pam-helper` to run one PAM transaction in a process the broker can kill.
public enum PAMHelperProcess {
    public static func main() -> Never {
        fatalError("PAM helper not built yet")
    }
}
