import KeyholdCore
/// What a rollback anchor needs from the store: the authenticated audit head (it only grows:
/// every audited request moves it) and a tag that binds an anchored value to this vault.
///
/// Hook for the TPM counter of issue 13 item 2 and the item-generation record of issue 8:
/// the value anchored outside the state directory is the head's sequence number today; a
/// generation counter bound into the head would be anchored the same way.
extension VaultStore {
    /// The audit head's sequence number, after checking its tag under the audit key (a head
    /// edited on disk is `.integrity`).
    public func authenticatedHeadSequence() throws(StoreError) -> Int64 {
        let head: Head?
        do { head = try readHead() } catch { throw StoreError.from(error) }
        guard let head else { return 0 }
        guard KeyedHash.equal(head.tag, headTag(seq: head.seq, mac: head.mac)) else { throw .integrity }
        return head.seq
    }

    /// A MAC of `seq` under this vault's audit key: an anchor file made for another vault, or
    /// edited, does not verify.
    public func anchorTag(seq: Int64) -> [UInt8] {
        var e = CanonicalEncoder(domain: "keyhold rollback anchor v1")
        e.append(seq)
        return KeyedHash.hash(e.bytes, key: auditKey)
    }

    public func anchorTagMatches(seq: Int64, tag: [UInt8]) -> Bool { KeyedHash.equal(tag, anchorTag(seq: seq)) }
}
