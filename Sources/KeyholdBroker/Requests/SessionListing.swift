import Glibc
import KeyholdAuth
import KeyholdCore
import KeyholdVault
import KeyholdProtocol

/// What a session answers about items without releasing a secret: `list` and `search` (page
/// by page on the long-read reader), `state`, `status`, `lock` and `biometry`. Each is audited
/// before anything is sent.
extension Session {
    /// Metadata of the caller's items, read and sent page by page: the long-read reader is held
    /// only while a page is read, and the client decodes one page while the next is read.
    func list(_ request: Request) -> Response {
        guard broker.audit(event(request, .list, decision: .granted, outcome: .ok)) else { return Response(.auditUnavailable) }
        return sendPages(failure: "the item list could not be read") { source, cursor throws(StoreError) in
            try source.items(owner: caller.uid, after: cursor, limit: Self.itemsPerPage)
        }
    }

    /// The caller's items whose attribute map holds every query pair (the store's index finds
    /// candidates, each is opened and matched exactly under the caller's uid). Audited like
    /// `list`: one entry per request, before anything is sent, with no names in it.
    func search(_ request: Request) -> Response {
        guard broker.audit(event(request, .search, decision: .granted, outcome: .ok)) else { return Response(.auditUnavailable) }
        return sendPages(failure: "the items could not be searched") { source, cursor throws(StoreError) in
            try source.search(owner: caller.uid, attributes: request.searchAttributes, after: cursor, limit: Self.itemsPerPage)
        }
    }

    /// Rows read per page by `list` and `search`. Pages run on the long-read reader
    /// (`Broker.longRead`), which is let go between pages, so other callers' long reads
    /// interleave with a long one.
    static let itemsPerPage = 500

    /// Reads pages with `read` and sends each as `.items` frames.
    private func sendPages(failure: String, _ read: (any LongReads, VaultStore.ItemPageCursor?) throws(StoreError)
                               -> VaultStore.ItemPage) -> Response {
        var count = 0, damaged = 0, socketFailed = false
        let unread = eachPage(read) { found in
            guard sendItems(found.items) else { socketFailed = true; return false }
            count += found.items.count
            damaged += found.damaged
            return true
        }
        if unread { return Response(.otherError, detail: failure) }
        if socketFailed { return Response(.otherError) }
        var r = Response(.ok, detail: damaged > 0 ? "\(damaged) damaged item(s) could not be read" : nil)
        r.count = UInt64(count)
        return r
    }

    /// Reads pages with `read` on the long-read reader, one at a time, and hands each to `body`
    /// until the last or until `body` says stop (false). True when a page could not be read.
    private func eachPage(_ read: (any LongReads, VaultStore.ItemPageCursor?) throws(StoreError) -> VaultStore.ItemPage,
                          _ body: (VaultStore.ItemPage) -> Bool) -> Bool {
        var cursor: VaultStore.ItemPageCursor?
        repeat {
            let page = broker.longRead { [cursor] (source) throws(StoreError) in try read(source, cursor) }
            guard case .success(let found) = page else { return true }
            guard body(found) else { return false }
            cursor = found.next
        } while cursor != nil
        return false
    }

    /// Metadata (never a secret) as `.items` frames; false when the socket failed.
    private func sendItems(_ items: [StoredItem]) -> Bool {
        let infos = items.map { i in
            ItemInfo(id: i.id.description, service: i.service, account: i.account, label: i.label, kind: i.kind,
                     policy: i.access.policy.description, allowedExecutables: i.access.allowedExecutables,
                     reuseSeconds: i.access.reuseSeconds, createdAt: i.createdAt, updatedAt: i.updatedAt,
                     generation: i.generation, expires: i.expires)
        }
        for batch in BrokerMessage.itemBatches(infos) where !send(batch) { return false }
        return true
    }

    func state(_ request: Request) -> Response {
        guard let ref = request.item else { return Response(.usage) }
        var r = Response(.ok)
        switch lookup(ref) {
        case .failure(let d): return deny(request, .state, item: nil, d)
        case .success(nil):
            r.state = "not-found"
            guard broker.audit(event(request, .state, decision: .granted, outcome: .notFound)) else { return Response(.auditUnavailable) }
            return r
        case .success(let item?):
            let availability = broker.gate.preview(item, caller: caller)
            // The lockout matters only to an item a get would authenticate for (as `get`: an
            // unreadable record refuses that one, never an item that needs no one).
            if availability == .requiresAuthentication {
                switch broker.gate.lockoutLeft(uid: caller.uid, store: broker) {
                case .success(let left): r.secondsLeft = left
                case .failure(let d): return deny(request, .state, item: item, d)
                }
            }
            r.state = availability.rawValue
            // Past its expiry the item is still released (the caller decides); `state` says so.
            if availability != .invalidated, let expires = item.expires, expires <= currentMicroseconds() { r.state = "expired" }
            r.generation = item.generation
            r.expires = item.expires
            guard broker.audit(event(request, .state, item: item, decision: .granted, outcome: .ok)) else { return Response(.auditUnavailable) }
            return r
        }
    }

    /// Anyone may ask how the vault is protected; nothing about items.
    func status(_ request: Request) -> Response {
        guard broker.audit(event(request, .status, decision: .granted, outcome: .ok)) else { return Response(.auditUnavailable) }
        return Response(.ok, detail: broker.protection.statusText)
    }

    func lock(_ request: Request) -> Response {
        broker.gate.endReuse(uid: caller.uid)
        guard broker.audit(event(request, .lock, decision: .granted, outcome: .ok)) else { return Response(.auditUnavailable) }
        return Response(.ok)
    }

    func biometry(_ request: Request) -> Response {
        var r = Response(.ok)
        switch broker.gate.domainState(user: caller.userName) {
        case .unreadable: r.detail = "fprintd's print store is not readable by the broker"
        case .noneEnrolled: break
        case .enrolled(let fingers, _): r.fingers = fingers
        }
        // The reader's name is not asked here: the root broker keeps no D-Bus client (the CLI
        // asks fprintd itself, as the user).
        // Counted page by page on the long-read reader, as `list` reads (a listing that cannot
        // be read counts nothing, as before).
        var bound = 0
        let unread = eachPage({ source, cursor throws(StoreError) in
            try source.items(owner: caller.uid, after: cursor, limit: Self.itemsPerPage)
        }) { found in
            bound += found.items.filter { $0.access.policy.bindsBiometrySet }.count
            return true
        }
        r.count = unread ? 0 : UInt64(bound)
        guard broker.audit(event(request, .biometry, decision: .granted, outcome: .ok)) else { return Response(.auditUnavailable) }
        return r
    }
}
