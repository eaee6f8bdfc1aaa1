import KeyholdCore
import KeyholdProtocol

/// Calls the Secret Service agent makes on behalf of a D-Bus client. Each carries the pid the
/// bus named as the sender (or `Request.unreadableClaimedPID`), which the broker checks and
/// records as a claimed requester (never trusted as an identity): there is no call without one.
extension Vault {
    public func secret(service: String, account: String, claimedPID: Int32, reason: String? = nil,
                       interaction: Interaction? = nil) throws(KeyholdError) -> SecureBytes {
        var r = Request(.get, item: ItemReference(service: service, account: account))
        r.reason = reason
        r.allowInteraction = interaction != nil
        r.claimedPID = claimedPID
        let response = try perform(r, interaction: interaction)
        guard let secret = response.secret else { throw .other("the broker released no secret") }
        return secret
    }

    /// Stores or replaces an item (no application-password policies through this path).
    public func store(_ secret: SecureBytes, service: String, account: String, label: String, policy: Policy,
                      reuseSeconds: UInt32, allowedExecutables: [String] = [], update: Bool,
                      claimedPID: Int32) throws(KeyholdError) {
        guard secret.count <= Limits.maxSecretBytes else {
            throw .invalidRequest("secret is \(secret.count) bytes; the limit is \(Limits.maxSecretBytes)")
        }
        guard !policy.requiresAppPassword else { throw .invalidRequest("an application password cannot be given over D-Bus") }
        var r = Request(.put, item: ItemReference(service: service, account: account))
        r.secret = secret
        r.label = label
        r.policy = policy.description
        r.reuseSeconds = reuseSeconds
        r.allowedExecutables = allowedExecutables
        r.update = update
        r.allowInteraction = false
        r.claimedPID = claimedPID
        _ = try perform(r, interaction: nil)
    }

    public func delete(service: String, account: String, claimedPID: Int32) throws(KeyholdError) {
        var r = Request(.delete, item: ItemReference(service: service, account: account))
        r.claimedPID = claimedPID
        _ = try perform(r, interaction: nil)
    }
}

extension Vault {
    /// Metadata of the caller's items whose attribute map (`AttributeMapping.attributes`) holds
    /// every pair of `attributes`; all of them for an empty map. The broker finds candidates
    /// through its keyed index and matches each item's sealed map exactly. Never a secret.
    public func search(attributes: [String: String], claimedPID: Int32? = nil) throws(KeyholdError) -> [ItemInfo] {
        guard attributes.count <= AttributeMapping.maxPairs else {
            throw .invalidRequest("more than \(AttributeMapping.maxPairs) attributes")
        }
        for (k, v) in attributes where k.utf8.count > Limits.maxTextBytes || v.utf8.count > Limits.maxTextBytes {
            throw .invalidRequest("an attribute is longer than \(Limits.maxTextBytes) bytes")
        }
        var r = Request(.search)
        r.searchAttributes = attributes
        r.claimedPID = claimedPID
        var found: [ItemInfo] = []
        _ = try perform(r, interaction: nil, onItems: { found.append(contentsOf: $0) })
        return found
    }
}

extension Vault {
    /// The claim for a sender the bus could not name (`Request.unreadableClaimedPID`).
    public static let unreadableClaimedPID = Request.unreadableClaimedPID

    /// Metadata of all the caller's items, for the D-Bus client whose pid is claimed.
    public func items(claimedPID: Int32) throws(KeyholdError) -> [ItemInfo] {
        var r = Request(.list)
        r.claimedPID = claimedPID
        var all: [ItemInfo] = []
        _ = try perform(r, interaction: nil, onItems: { all.append(contentsOf: $0) })
        return all
    }

    /// Has the broker audit a D-Bus call the agent refused (another user's process, a sender
    /// gone or unreadable): a request that can read nothing — the named item's state, or a
    /// search no item matches — carrying the sender's claim, which the broker refuses under
    /// that operation with why, `asked` naming the call. The agent has already refused the
    /// call whatever this answers; the real operation is never sent.
    public func reportRefusal(item: ItemReference?, claimedPID: Int32, asked: String) {
        var r: Request
        if let item {
            r = Request(.state, item: item)
        } else {
            r = Request(.search)
            r.searchAttributes = [Self.refusalMarker: ""]
        }
        r.reason = "refused by the Secret Service agent: \(asked)"
        r.claimedPID = claimedPID
        _ = try? perform(r, interaction: nil)
    }

    /// The report's search: an attribute no client is expected to store, so that even a
    /// report the broker carried out would list (to the agent, which drops it) nothing.
    static let refusalMarker = "keyhold.refused-call"
}
