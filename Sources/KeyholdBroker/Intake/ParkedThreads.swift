import Glibc
import KeyholdCore

/// Connection threads that, after their connection, park for the next one instead of exiting:
/// creating and tearing down a thread (stack mapping, clone, exit) per `get` was a visible part
/// of the broker's CPU. A connection still never waits for another: when no parked thread is
/// free, a new one is started, as before. At most `maxParked` wait; the rest exit (256: with
/// 64 it was fewer than 64 clients keep busy, so threads were made and torn down per request).
final class ParkedThreads: @unchecked Sendable {
    private let mutex: UnsafeMutablePointer<pthread_mutex_t>
    private let wake: UnsafeMutablePointer<pthread_cond_t>
    /// Parked threads, and connections handed to them but not yet taken: `parked > pending.count`
    /// means some parked thread is still free.
    private var parked = 0
    private var pending: [@Sendable () -> Void] = []
    let maxParked: Int

    init(maxParked: Int = 256) {
        self.maxParked = maxParked
        mutex = .allocate(capacity: 1)
        wake = .allocate(capacity: 1)
        pthread_mutex_init(mutex, nil)
        pthread_cond_init(wake, nil)
    }

    /// Runs `body` on a parked thread or a new one; false when no thread could be created.
    func run(_ body: @escaping @Sendable () -> Void) -> Bool {
        pthread_mutex_lock(mutex)
        if parked > pending.count {
            pending.append(body)
            pthread_cond_signal(wake)
            pthread_mutex_unlock(mutex)
            return true
        }
        pthread_mutex_unlock(mutex)
        return DetachedThread.start { [self] in
            body()
            parkAndServe()
        }
    }

    /// Waits for handed-over connections and serves them; returns (ending the thread) when
    /// enough threads are parked already.
    private func parkAndServe() {
        pthread_mutex_lock(mutex)
        while parked < maxParked {
            parked += 1
            while pending.isEmpty { pthread_cond_wait(wake, mutex) }
            parked -= 1
            let body = pending.removeFirst()
            pthread_mutex_unlock(mutex)
            body()
            pthread_mutex_lock(mutex)
        }
        pthread_mutex_unlock(mutex)
    }
}
