// Test support shared by the test targets: fixtures that start real services.
import Foundation
import Testing

/// Runs `count` real threads at once (not GCD workers, whose pool is too small to block dozens
/// at a time) and returns when all have finished.
public func runThreads(_ count: Int, _ body: @escaping @Sendable (Int) -> Void) {
    let done = DispatchSemaphore(value: 0)
    for i in 0..<count {
        let t = Thread { body(i); done.signal() }
        t.stackSize = 1 << 20
        t.start()
    }
    for _ in 0..<count { done.wait() }
}

/// SQL that puts back, from the vault copy at `snapshot`, every row a rollback of the state
/// directory restores consistently (items, search index, generation record and its head, the
/// audit head), in one transaction: the attacker who saved the directory and writes it back.
public func restoreVaultRowsSQL(from snapshot: String) -> String {
    """
    ATTACH '\(snapshot)' AS old;
    BEGIN IMMEDIATE;
    DELETE FROM items; INSERT INTO items SELECT * FROM old.items;
    DELETE FROM item_search; INSERT INTO item_search SELECT * FROM old.item_search;
    DELETE FROM item_generation; INSERT INTO item_generation SELECT * FROM old.item_generation;
    DELETE FROM item_generation_head; INSERT INTO item_generation_head SELECT * FROM old.item_generation_head;
    DELETE FROM audit_head; INSERT INTO audit_head SELECT * FROM old.audit_head;
    COMMIT;
    """
}

/// Expects `actual` to equal `expected`, two secrets: on a mismatch the issue names only their
/// lengths ("missing" for nil), never a byte of either, where `#expect(a == b)` prints both.
public func expectSecret(_ actual: (some Collection<UInt8>)?, equals expected: (some Collection<UInt8>)?,
                         _ comment: Comment? = nil, sourceLocation: SourceLocation = #_sourceLocation) {
    let equal = switch (actual, expected) {
    case (nil, nil): true
    case let (actual?, expected?): actual.elementsEqual(expected)
    default: false
    }
    if equal { return }
    func length(_ bytes: (some Collection<UInt8>)?) -> String { bytes.map { "\($0.count) bytes" } ?? "missing" }
    let note = comment.map { ": \($0.rawValue)" } ?? ""
    Issue.record("the secret differs: \(length(actual)), expected \(length(expected))\(note)", sourceLocation: sourceLocation)
}

/// `expectSecret` on the UTF-8 bytes of two strings.
public func expectSecret(_ actual: String?, equals expected: String?,
                         _ comment: Comment? = nil, sourceLocation: SourceLocation = #_sourceLocation) {
    expectSecret(actual?.utf8, equals: expected?.utf8, comment, sourceLocation: sourceLocation)
}

/// A listening Unix stream socket (close-on-exec) bound at `path`, for a test that plays the
/// broker's side of a connection; -1 when it could not be bound or listen.
public func listeningUnixSocket(at path: String, backlog: Int32) -> Int32 {
    let listener = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
    guard listener >= 0 else { return -1 }
    var addr = sockaddr_un()
    addr.sun_family = sa_family_t(AF_UNIX)
    let bytes = Array(path.utf8)
    guard bytes.count < MemoryLayout.size(ofValue: addr.sun_path) else { close(listener); return -1 }
    withUnsafeMutableBytes(of: &addr.sun_path) { raw in raw.copyBytes(from: bytes); raw[bytes.count] = 0 }
    let bound = withUnsafePointer(to: &addr) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(listener, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
    }
    guard bound == 0, listen(listener, backlog) == 0 else { close(listener); return -1 }
    return listener
}
