// Test support shared by the test targets: fixtures that start real services.
import Foundation
import Testing
import KeyholdCore

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

/// Copies the program at `source` to `destination` (which must not exist) with the source's
/// permission bits, through close-on-exec descriptors. FileManager's copy holds the new file
/// open for writing without `O_CLOEXEC`: a process another test spawns meanwhile inherits
/// that descriptor, and running the copy then fails with "Text file busy" while it lives.
public func copyProgram(_ source: String, to destination: String) throws {
    let input = open(source, O_RDONLY | O_CLOEXEC)
    guard input >= 0 else { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
    defer { close(input) }
    var st = stat()
    guard fstat(input, &st) == 0 else { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
    let output = open(destination, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, st.st_mode & 0o7777)
    guard output >= 0 else { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
    defer { close(output) }
    var buffer = [UInt8](repeating: 0, count: 1 << 16)
    while true {
        let n = buffer.withUnsafeMutableBytes { read(input, $0.baseAddress!, $0.count) }
        if n < 0 && errno == EINTR { continue }
        guard n >= 0 else { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
        if n == 0 { break }
        let code = buffer.withUnsafeBytes { DescriptorIO.writeAll(output, UnsafeRawBufferPointer(rebasing: $0[..<n])) }
        guard code == 0 else { throw POSIXError(POSIXErrorCode(rawValue: code) ?? .EIO) }
    }
    // The mode again: open's was filtered by the umask.
    guard fchmod(output, st.st_mode & 0o7777) == 0 else { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
}
