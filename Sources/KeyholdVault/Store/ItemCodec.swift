import Glibc
import KeyholdCore

/// The item codec: the one place that turns an item into its row (validation, sealing under
/// the associated data that binds id, owner, names, kind, policy, executables, reuse window,
/// biometry digest, password hashing, generation and expiry) and a row back into an item (every
/// inconsistency is `.integrity`). The store's queries and transactions live in VaultStore+Items.swift.
extension VaultStore {
    static let itemColumns = "id, owner_uid, lookup, kind, policy, allowed_executables, reuse_seconds, biometry_state, pwhash_params, attributes, created_us, updated_us, generation, expires_us"
    /// The index of the first column a query selects after `itemColumns` (a page's rowid).
    static let columnAfterItem: Int32 = 14

    /// The columns of an item row, as read (possibly altered on disk).
    struct ItemRow: Sendable, Equatable {
        var id: [UInt8]
        var owner: Int64
        var lookup: [UInt8]
        var kind: Int64
        var policy: String
        var allowedExecutables: [UInt8]
        var reuseSeconds: Int64
        var biometryState: [UInt8]?
        var passwordHashing: [UInt8]?
        var attributes: [UInt8]
        var createdAt: Int64
        var updatedAt: Int64
        var generation: Int64
        var expires: Int64?

        init(_ s: Statement) {
            id = s.blob(0); owner = s.int64(1); lookup = s.blob(2); kind = s.int64(3); policy = s.text(4)
            allowedExecutables = s.blob(5); reuseSeconds = s.int64(6); biometryState = s.optionalBlob(7)
            passwordHashing = s.optionalBlob(8); attributes = s.blob(9); createdAt = s.int64(10); updatedAt = s.int64(11)
            generation = s.int64(12)
            expires = s.isNull(13) ? nil : s.int64(13)
        }
    }

    /// Checks a row and opens its attributes. Every inconsistency is `.integrity`.
    /// `checkLookup`: a lookup by name must also prove the row's lookup column is the blind
    /// index of its names (else a swapped lookup would answer for another item); a listing
    /// shows each row under its own authenticated names and can skip that hash.
    /// `generations`: the verified record; a row older (or newer) than the item's current
    /// generation, or of an item the record does not know, is `.integrity`.
    func decode(_ row: ItemRow, generations: GenerationRecord, checkLookup: Bool = true) throws(StoreError) -> StoredItem {
        guard let id = ItemID(bytes: row.id),
              let owner = UInt32(exactly: row.owner),
              let kindRaw = UInt8(exactly: row.kind), let kind = ItemKind(rawValue: kindRaw),
              let policy = try? Policy(parsing: row.policy), policy.description == row.policy,
              let executables = Self.decodeExecutables(row.allowedExecutables),
              let reuse = UInt32(exactly: row.reuseSeconds), reuse <= Limits.maxReuseSeconds,
              row.biometryState.map({ $0.count == KeyedHash.byteCount }) ?? true
        else { throw .integrity }
        var passwordHashing: PasswordHashParameters?
        if let raw = row.passwordHashing {
            guard let p = try? PasswordHashParameters(encoded: raw) else { throw .integrity }
            passwordHashing = p
        }
        guard policy.requiresAppPassword == (passwordHashing != nil) else { throw .integrity }
        try checkGeneration(id, row.generation, in: generations)
        let generation = UInt64(row.generation)
        let access = AccessControl(policy: policy, allowedExecutables: executables, reuseSeconds: reuse)
        var ad = AssociatedData(itemID: id, owner: owner, service: "", account: "", kind: kind, access: access,
                                biometryState: row.biometryState, passwordHashing: passwordHashing, generation: generation,
                                expires: row.expires)
        let names: [UInt8]
        do {
            names = try SealedBox(combined: row.attributes).openAttributes(using: attributeKey, authenticating: ad.encoded(for: .attributes, policyText: row.policy))
        } catch { throw .integrity }
        var d = CanonicalDecoder(names)
        guard d.expect("attributes"),
              let service = d.text(), let account = d.text(), let label = d.text(), d.isAtEnd
        else { throw .integrity }
        // The lookup column must be the blind index of the names inside: a lookup swapped
        // between rows would otherwise return another item for a request.
        if checkLookup {
            let index = BlindIndex(key: blindIndexKey, owner: owner, service: service, account: account)
            guard KeyedHash.equal(index.bytes, row.lookup) else { throw .integrity }
        }
        ad.service = service
        ad.account = account
        return StoredItem(id: id, owner: owner, service: service, account: account, label: label, kind: kind,
                          access: access, biometryState: row.biometryState, createdAt: row.createdAt,
                          updatedAt: row.updatedAt, passwordHashing: passwordHashing, generation: generation,
                          expires: row.expires)
    }

    static func encodeExecutables(_ paths: [String]) -> [UInt8] {
        var e = CanonicalEncoder(domain: "executables")
        e.append(UInt32(paths.count))
        for p in paths { e.append(p) }
        return e.bytes
    }

    static func decodeExecutables(_ raw: [UInt8]) -> [String]? {
        var d = CanonicalDecoder(raw)
        guard d.expect("executables"),
              let n = d.uint32(), n <= Limits.maxAllowedExecutables else { return nil }
        var paths: [String] = []
        for _ in 0..<n {
            guard let p = d.text() else { return nil }
            paths.append(p)
        }
        return d.isAtEnd ? paths : nil
    }

    /// Rejects what the store will not keep, before any work is done.
    func validate(_ item: NewItem, secret: SecureBytes, appPassword: AppPasswordKey?) throws(StoreError) {
        // An empty secret is accepted: a token may legitimately be empty, and refusing it would
        // force callers to invent a placeholder. The box still authenticates it.
        guard secret.count <= Limits.maxSecretBytes else { throw .tooLarge }
        for text in [item.service, item.account, item.label] + item.access.allowedExecutables {
            guard text.utf8.count <= Limits.maxTextBytes else { throw .tooLarge }
        }
        guard !item.service.isEmpty, !item.account.isEmpty,
              item.access.allowedExecutables.count <= Limits.maxAllowedExecutables,
              item.access.reuseSeconds <= Limits.maxReuseSeconds,
              item.biometryState.map({ $0.count == KeyedHash.byteCount }) ?? true,
              !item.access.policy.bindsBiometrySet || item.biometryState != nil
        else { throw .invalidItem }
        if item.access.policy.requiresAppPassword {
            guard appPassword != nil else { throw .appPasswordRequired }  // its shape: AppPasswordKey
        } else if appPassword != nil {
            throw .invalidItem  // a password the policy would never ask for protects nothing
        }
    }

    /// The sealed columns of an item.
    struct SealedColumns {
        var lookup: BlindIndex
        var attributes: SealedBox
        var wrappedKey: SealedBox
        var secret: SealedBox
        var passwordHashing: PasswordHashParameters?
    }

    func seal(id: ItemID, owner: UInt32, generation: UInt64, _ item: NewItem, secret: SecureBytes,
                      appPassword: AppPasswordKey?) throws(StoreError) -> SealedColumns {
        let params = item.access.policy.requiresAppPassword ? appPassword?.parameters : nil
        let ad = AssociatedData(itemID: id, owner: owner, service: item.service, account: item.account, kind: item.kind,
                                access: item.access, biometryState: item.biometryState, passwordHashing: params,
                                generation: generation, expires: item.expires)
        var names = CanonicalEncoder(domain: "attributes")
        names.append(item.service)
        names.append(item.account)
        names.append(item.label)
        let attributes = SealedBox.seal(names.bytes, using: attributeKey, authenticating: ad.encoded(for: .attributes))
        let itemKey = ItemKey.generate()
        let secretBox = SealedBox.seal(secret, using: itemKey, authenticating: ad.encoded(for: .secret))
        let wrapped: SealedBox
        if params != nil, let appPassword {
            let inner = SealedBox.seal(itemKey.keyBytes.bytes, using: appPassword.key, authenticating: ad.encoded(for: .passwordWrappedKey))
            wrapped = SealedBox.seal(inner.combined, using: wrappingKey, authenticating: ad.encoded(for: .wrappedKey))
        } else {
            wrapped = SealedBox.seal(itemKey.keyBytes.bytes, using: wrappingKey, authenticating: ad.encoded(for: .wrappedKey))
        }
        return SealedColumns(lookup: BlindIndex(key: blindIndexKey, owner: owner, service: item.service, account: item.account),
                             attributes: attributes, wrappedKey: wrapped, secret: secretBox, passwordHashing: params)
    }

    func bindItem(_ s: Statement, id: ItemID, owner: UInt32, _ item: NewItem, _ sealed: SealedColumns) throws(DatabaseError) {
        try s.bind(1, blob: id.bytes)
        try s.bind(2, Int64(owner))
        try s.bind(3, blob: sealed.lookup.bytes)
        try s.bind(4, Int64(item.kind.rawValue))
        try s.bind(5, text: item.access.policy.description)
        try s.bind(6, blob: Self.encodeExecutables(item.access.allowedExecutables))
        try s.bind(7, Int64(item.access.reuseSeconds))
        try s.bind(8, blob: item.biometryState)
        try s.bind(9, blob: sealed.passwordHashing?.encoded)
        try s.bind(10, blob: sealed.attributes.combined)
        try s.bind(11, blob: sealed.wrappedKey.combined)
        try s.bind(12, blob: sealed.secret.combined)
        if let expires = item.expires { try s.bind(16, expires) } else { try s.bindNull(16) }
    }
}
