import Glibc
import KeyholdCore
import KeyholdProtocol

/// What a rotation did.
public struct RotationResult: Sendable {
    /// The item's secret now: what `body` returned, or, when another caller's rotation
    /// finished while this one waited, that caller's new secret (and `body` never ran).
    public let secret: SecureBytes
    public let generation: UInt64
    /// The item's expiry now (the one given to this rotation, or the other caller's).
    public let expires: Int64?
    /// False when another caller rotated the item first and `body` was not called.
    public let rotatedHere: Bool
}

extension Vault {
    /// Rotates a secret in one step, under one authentication: the broker checks the item's
    /// policy (as for `secret(service:account:)`), takes the item's rotation lease, hands
    /// `body` the current secret, and stores what `body` returns at the next generation. If
    /// `body` throws, or `timeout` seconds (the lease's lifetime) pass, nothing changes.
    /// While another caller holds the lease this waits (up to `timeout`); if that caller then
    /// changed the item, its new secret is returned without calling `body`: one refresh for
    /// all of them. The returned secret belongs to the caller (wipe it when done). `current`
    /// is wiped once `body` returns: copy what must outlive it. An error `body` throws other
    /// than a `KeyholdError` reaches the caller with its description in the message, so it
    /// should not carry the secret.
    /// `expires` (µs since the epoch) is stored with the new secret; nil stores none.
    public func rotate(service: String, account: String, reason: String? = nil, timeout: UInt32? = nil,
                       expires: Int64? = nil, interaction: Interaction? = nil,
                       _ body: (SecureBytes) throws -> SecureBytes) throws(KeyholdError) -> RotationResult {
        try rotate(service: service, account: account, reason: reason, timeout: timeout, expires: expires,
                   interaction: interaction, watchingBroker: { current, _ in try body(current) })
    }

    /// `rotate`, with `body` also given the broker's connection to watch while it works: the
    /// broker sends nothing until `body` returns, so that socket turning readable means the
    /// broker is gone (or restarting), and whatever `body` started (`keyhold rotate`'s COMMAND)
    /// should stop: its result could not be committed.
    public func rotate(service: String, account: String, reason: String? = nil, timeout: UInt32? = nil,
                       expires: Int64? = nil, interaction: Interaction? = nil,
                       watchingBroker body: (SecureBytes, BrokerWatch) throws -> SecureBytes) throws(KeyholdError) -> RotationResult {
        if let timeout, timeout == 0 || timeout > Limits.maxRotationSeconds {
            throw .invalidRequest("the timeout must be 1 to \(Limits.maxRotationSeconds) seconds")
        }
        var r = Request(.rotate, item: ItemReference(service: service, account: account))
        r.reason = reason
        r.timeoutSeconds = timeout
        r.allowInteraction = interaction != nil
        try checkItemNames(r)
        var produced: SecureBytes?
        var failure: KeyholdError?
        let conn = try BrokerConnection(socketPath: socketPath)
        defer { conn.close() }
        let watch = BrokerWatch(fd: conn.fd)
        let response: Response
        do throws(KeyholdError) {
            response = try conn.perform(r, interaction: interaction, onRotation: { current, _ in
                do {
                    var next = try body(current, watch)
                    // `current` is wiped once this returns, before the reply is sent: a body that
                    // hands it back (the token is still good) must not store zeros.
                    if next === current { next = current.withUnsafeBytes { SecureBytes(copying: $0) } }
                    guard next.count <= Limits.maxSecretBytes else {
                        next.wipe()
                        failure = .invalidRequest("the new secret exceeds the \(Limits.maxSecretBytes)-byte limit; nothing changed")
                        return .cancel
                    }
                    produced = next
                    return .rotated(next, expires: expires)
                } catch let e as KeyholdError {
                    failure = e
                } catch {
                    failure = .other("the rotation failed (\(error)); nothing changed")
                }
                return .cancel
            })
        } catch {
            // The body's own failure explains more than the cancel that could not be sent
            // (the broker gone while COMMAND ran).
            produced?.wipe()
            throw failure ?? error
        }
        if let failure {
            produced?.wipe()
            response.secret?.wipe()
            throw failure
        }
        guard response.outcome == .ok else {
            produced?.wipe()
            throw KeyholdError(response)
        }
        if let produced {
            return RotationResult(secret: produced, generation: response.generation ?? 0, expires: response.expires,
                                  rotatedHere: true)
        }
        guard let secret = response.secret else { throw .other("the broker released no secret") }
        return RotationResult(secret: secret, generation: response.generation ?? 0, expires: response.expires,
                              rotatedHere: false)
    }
}

/// The broker's end of a rotation in progress, for a body to watch (poll for input: any
/// means the connection ended). Never read from or written to by the body.
public struct BrokerWatch: Sendable {
    public let fd: Int32

    /// True once the broker's side of the connection has closed or failed.
    public func brokerLeft() -> Bool {
        var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        return poll(&pfd, 1, 0) > 0
    }
}

/// A released secret with the item's generation (for `put --update --if-generation`).
public struct ReleasedSecret: Sendable {
    public let secret: SecureBytes
    public let generation: UInt64
    public let expires: Int64?
}

extension Vault {
    /// Like `secret(service:account:)`, with the generation the secret was read at.
    public func release(service: String, account: String, reason: String? = nil,
                        interaction: Interaction? = nil) throws(KeyholdError) -> ReleasedSecret {
        var r = Request(.get, item: ItemReference(service: service, account: account))
        r.reason = reason
        r.allowInteraction = interaction != nil
        try checkItemNames(r)
        let conn = try BrokerConnection(socketPath: socketPath)
        defer { conn.close() }
        let response = try conn.perform(r, interaction: interaction)
        guard response.outcome == .ok else { throw KeyholdError(response) }
        guard let secret = response.secret, let generation = response.generation else {
            response.secret?.wipe()
            throw .other("the broker released no secret or generation")
        }
        return ReleasedSecret(secret: secret, generation: generation, expires: response.expires)
    }
}
