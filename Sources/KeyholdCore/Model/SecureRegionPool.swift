import Glibc
import CSodium

/// Wiped `sodium_malloc` regions kept for reuse. Each `sodium_malloc`/`sodium_free` pair costs
/// an mmap, three mprotects, mlock/munlock and an munmap, and in a threaded process every
/// protection change is a TLB shootdown on all cores: a broker `get` made several of them, and
/// they were its largest CPU cost. A region is only pooled after its used bytes were zeroed
/// (`SecureBytes.deinit`), so the pool holds no secret; its guard pages and lock stay in place.
/// Bounded per size class so a burst does not keep much locked memory: 256 of each class up
/// to 256 B (keys, MACs, a token: what every request takes, several at once per request in
/// flight; with 32 the pool ran dry under 64 clients and every get paid the syscalls again),
/// 32 up to 4 KiB, 4 above: at most about 8 MiB resident kept (a small region takes two
/// pages), about half of it locked where the mlock limit allows.
enum SecureRegionPool {
    /// Size classes 64 B … 64 KiB; larger buffers are allocated and freed directly.
    static let smallest = 64
    static let classCount = 11
    static func keep(_ sizeClass: Int) -> Int { sizeClass <= 2 ? 256 : sizeClass <= 6 ? 32 : 4 }

    private final class Shelves: @unchecked Sendable {
        let mutex: UnsafeMutablePointer<pthread_mutex_t>
        var free: [[UnsafeMutableRawPointer]]
        init() {
            mutex = .allocate(capacity: 1)
            pthread_mutex_init(mutex, nil)
            free = Array(repeating: [], count: SecureRegionPool.classCount)
            for i in free.indices { free[i].reserveCapacity(SecureRegionPool.keep(i)) }
        }
    }
    private static let shelves = Shelves()

    /// A zeroed-where-used region for `count` bytes: (region, size class or -1, capacity).
    static func take(count: Int) -> (UnsafeMutableRawPointer, Int, Int) {
        var sizeClass = 0
        while sizeClass < classCount, smallest << sizeClass < count { sizeClass += 1 }
        guard sizeClass < classCount else {
            guard let p = sodium_malloc(count) else { fatalError("sodium_malloc failed") }
            return (p, -1, count)
        }
        let capacity = smallest << sizeClass
        pthread_mutex_lock(shelves.mutex)
        let reused = shelves.free[sizeClass].popLast()
        pthread_mutex_unlock(shelves.mutex)
        if let reused { return (reused, sizeClass, capacity) }
        guard let p = sodium_malloc(capacity) else { fatalError("sodium_malloc failed") }
        sodium_memzero(p, capacity)
        return (p, sizeClass, capacity)
    }

    /// Takes back a region whose used bytes the caller has zeroed; frees it when its shelf is full.
    static func give(_ region: UnsafeMutableRawPointer, sizeClass: Int) {
        if sizeClass >= 0 {
            pthread_mutex_lock(shelves.mutex)
            let kept = shelves.free[sizeClass].count < keep(sizeClass)
            if kept { shelves.free[sizeClass].append(region) }
            pthread_mutex_unlock(shelves.mutex)
            if kept { return }
        }
        sodium_free(region)
    }
}
