import Glibc

/// Monotonic time for deadlines (the wall clock may jump). The one clock the CLI's askpass and
/// subprocess waits, the PAM helper's deadlines and `DescriptorIO` use.
public enum MonotonicClock {
    public static func nanoseconds() -> UInt64 {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return UInt64(ts.tv_sec) * 1_000_000_000 + UInt64(ts.tv_nsec)
    }

    public static func milliseconds() -> Int64 { Int64(nanoseconds() / 1_000_000) }
}
