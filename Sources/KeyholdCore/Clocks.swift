import Glibc

/// Monotonic time for deadlines and windows (the wall clock may jump): the one clock every
/// deadline, timeout and reuse-window check in Keyhold reads.
public enum MonotonicClock {
    public static func nanoseconds() -> UInt64 {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return UInt64(ts.tv_sec) * 1_000_000_000 + UInt64(ts.tv_nsec)
    }

    public static func microseconds() -> Int64 { Int64(nanoseconds() / 1_000) }

    public static func milliseconds() -> Int64 { Int64(nanoseconds() / 1_000_000) }
}

/// Wall-clock time in microseconds since the epoch (UTC): what audit entries, item times and
/// expiries record. Never used for a deadline.
public func currentMicroseconds() -> Int64 {
    var ts = timespec()
    clock_gettime(CLOCK_REALTIME, &ts)
    return Int64(ts.tv_sec) * 1_000_000 + Int64(ts.tv_nsec) / 1000
}
