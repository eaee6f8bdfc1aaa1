// BiometryReader's small D-Bus client against hostile "buses": wrong addresses, refusals,
// oversized, truncated and malformed replies. Each must give nil, never a crash or a hang.
import Foundation
import Glibc
import KeyholdAuth
import KeyholdCLI
import Testing

/// A one-connection fake bus on a unix socket: after the client's first bytes it writes
/// `reply` and then holds the connection open until the client closes it.
final class FakeDBusServer: @unchecked Sendable {
    let dir: String
    var path: String { dir + "/bus" }
    private let listener: Int32
    private let done = DispatchSemaphore(value: 0)

    init(reply: [UInt8]) throws {
        var t = Array("/tmp/khbus-XXXXXX".utf8CString)
        guard let p = t.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }) else { throw POSIXError(.EIO) }
        dir = String(cString: p)
        listener = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        var addr = sockaddr_un()
        addr.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array((dir + "/bus").utf8)
        withUnsafeMutableBytes(of: &addr.sun_path) { raw in raw.copyBytes(from: bytes); raw[bytes.count] = 0 }
        let len = socklen_t(MemoryLayout<sa_family_t>.size + bytes.count + 1)
        let bound = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(listener, $0, len) } }
        guard bound == 0, listen(listener, 1) == 0 else { throw POSIXError(.EIO) }
        let fd = listener
        let done = self.done
        Thread.detachNewThread {
            defer { done.signal() }
            let c = accept(fd, nil, nil)
            guard c >= 0 else { return }
            defer { close(c) }
            var buf = [UInt8](repeating: 0, count: 4096)
            _ = buf.withUnsafeMutableBytes { read(c, $0.baseAddress!, $0.count) }
            _ = reply.withUnsafeBytes { send(c, $0.baseAddress!, $0.count, Int32(MSG_NOSIGNAL)) }
            while buf.withUnsafeMutableBytes({ read(c, $0.baseAddress!, $0.count) }) > 0 {}
        }
    }

    func finish() {
        shutdown(listener, Int32(SHUT_RDWR))
        close(listener)
        _ = done.wait(timeout: .now() + 5)
        try? FileManager.default.removeItem(atPath: dir)
    }
}

/// A little-endian D-Bus message header as a hostile bus might send it.
func rawDBusMessage(type: UInt8, bodyLength: UInt32, fieldsLength: UInt32, fields: [UInt8] = [], body: [UInt8] = []) -> [UInt8] {
    func le(_ v: UInt32) -> [UInt8] { [UInt8(v & 0xff), UInt8(v >> 8 & 0xff), UInt8(v >> 16 & 0xff), UInt8(v >> 24)] }
    var m: [UInt8] = [UInt8(ascii: "l"), type, 0, 1] + le(bodyLength) + le(7) + le(fieldsLength) + fields
    while m.count % 8 != 0 { m.append(0) }
    return m + body
}

@Suite struct BiometryReaderTests {
    @Test func unusableAddressesGiveNil() throws {
        for address in ["", "tcp:host=localhost,port=1", "unix:abstract=khfp", "unix:path=", "unix:path=/nonexistent/khfp/bus",
                        "unix:path=/" + String(repeating: "x", count: 200), "garbage"] {
            #expect(BiometryReader.readerDescription(busAddress: address, timeoutMilliseconds: 200) == nil, "\(address)")
        }
    }

    static let ok: [UInt8] = Array("OK 01\r\n".utf8)
    static let hostileReplies: [(String, [UInt8])] = {
        var cases: [(String, [UInt8])] = []
        cases.append(("refused", Array("REJECTED EXTERNAL\r\n".utf8)))
        cases.append(("closed after OK", Array("OK 0123456789abcdef\r\n".utf8)))
        cases.append(("no CRLF, endless line", [UInt8](repeating: UInt8(ascii: "O"), count: 2000)))
        let bigEndian: [UInt8] = [UInt8(ascii: "B"), 2, 0, 1] + [UInt8](repeating: 0, count: 12)
        cases.append(("big-endian reply", ok + bigEndian))
        cases.append(("oversized body", ok + rawDBusMessage(type: 2, bodyLength: 0x7fff_fff0, fieldsLength: 0)))
        cases.append(("oversized fields", ok + rawDBusMessage(type: 2, bodyLength: 0, fieldsLength: 0xffff_fff0)))
        let truncated = Array(rawDBusMessage(type: 2, bodyLength: 64, fieldsLength: 0).prefix(20))
        cases.append(("truncated message", ok + truncated))
        // an error-name field (4) whose string claims to run past the fields array
        let pastEnd: [UInt8] = [4, 1, UInt8(ascii: "s"), 0, 0xff, 0xff, 0, 0, 0x41, 0x41, 0x41, 0x41]
        cases.append(("string past end", ok + rawDBusMessage(type: 2, bodyLength: 0, fieldsLength: 12, fields: pastEnd)))
        let oddType: [UInt8] = [5, 1, UInt8(ascii: "x"), 0, 1, 0, 0, 0]
        cases.append(("odd field type", ok + rawDBusMessage(type: 2, bodyLength: 0, fieldsLength: 8, fields: oddType)))
        let otherSerial: [UInt8] = [5, 1, UInt8(ascii: "u"), 0, 99, 0, 0, 0]
        cases.append(("a reply to someone else, then silence",
                      ok + rawDBusMessage(type: 2, bodyLength: 0, fieldsLength: 8, fields: otherSerial)))
        return cases
    }()

    @Test(arguments: hostileReplies)
    func hostileBusGivesNil(_ name: String, _ reply: [UInt8]) throws {
        let bus = try FakeDBusServer(reply: reply)
        defer { bus.finish() }
        #expect(BiometryReader.readerDescription(busAddress: "unix:path=\(bus.path)", timeoutMilliseconds: 300) == nil, "\(name)")
    }
}
