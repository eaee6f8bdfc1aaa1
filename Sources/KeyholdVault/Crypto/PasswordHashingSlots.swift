import Glibc

/// At most `capacity` Argon2id derivations at once in this process; later ones wait for a slot
/// before any of their memory is allocated. Each derivation holds its memory limit (256 MiB at
/// MODERATE) for about half a second: unbounded, one local user's connections, each storing an
/// item under an application password at once, would make the root broker hold gigabytes.
public final class PasswordHashingSlots: @unchecked Sendable {
    /// The broker's: one derivation per core of the machines it is measured on (two), 512 MiB
    /// at most at MODERATE.
    public static let shared = PasswordHashingSlots(capacity: 2)

    private let semaphore: UnsafeMutablePointer<sem_t>

    public init(capacity: Int) {
        semaphore = .allocate(capacity: 1)
        sem_init(semaphore, 0, UInt32(max(capacity, 1)))
    }

    deinit {
        sem_destroy(semaphore)
        semaphore.deallocate()
    }

    /// Runs `body` holding one slot.
    public func withSlot<R, E: Error>(_ body: () throws(E) -> R) throws(E) -> R {
        while sem_wait(semaphore) != 0 && errno == EINTR {}
        defer { sem_post(semaphore) }
        return try body()
    }
}
