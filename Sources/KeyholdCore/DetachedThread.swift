import Glibc

/// A detached POSIX thread running one closure: the broker's connection, signal and flusher
/// threads and the Secret Service agent's prompt threads, without Foundation's `Thread` (no run
/// loop, no autorelease pool, a fixed small stack; the broker and the agent do not load Foundation).
public enum DetachedThread {
    private final class Body {
        let run: () -> Void
        init(_ run: @escaping () -> Void) { self.run = run }
    }

    /// Starts `body` on a new detached thread; false when the thread could not be created
    /// (the caller then refuses the work instead of running it inline).
    @discardableResult
    public static func start(_ body: @escaping @Sendable () -> Void) -> Bool {
        var attr = pthread_attr_t()
        pthread_attr_init(&attr)
        defer { pthread_attr_destroy(&attr) }
        pthread_attr_setstacksize(&attr, 1 << 20)
        pthread_attr_setdetachstate(&attr, Int32(PTHREAD_CREATE_DETACHED))
        let box = Unmanaged.passRetained(Body(body))
        var thread = pthread_t()
        let rc = pthread_create(&thread, &attr, { raw in
            let body = Unmanaged<Body>.fromOpaque(raw!).takeRetainedValue()
            body.run()
            return nil
        }, box.toOpaque())
        if rc != 0 {
            box.release()
            return false
        }
        return true
    }
}
