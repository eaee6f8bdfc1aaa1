// fprintd's D-Bus API, for what only fprintd knows: the reader's name (for `keyhold biometry`).
// Never used for the domain state digest (the broker reads fprintd's print store instead). It
// runs in the CLI, as the user, so the root broker keeps no bus client. A deliberately tiny D-Bus client — one unix socket, SASL EXTERNAL,
// a few method calls, little-endian messages only — so Keyhold needs no D-Bus library.
// Every failure (no bus, no fprintd, a malformed or oversized reply, a timeout) is nil.
import Glibc
import CKeyholdOS
import KeyholdCore

public enum BiometryReader {
    /// The system bus address used when none is given: `$DBUS_SYSTEM_BUS_ADDRESS`, else the
    /// standard socket (the same rule pam_fprintd's sd-bus follows).
    public static func systemBusAddress() -> String {
        if let a = getenv("DBUS_SYSTEM_BUS_ADDRESS") { return String(cString: a) }
        return "unix:path=/run/dbus/system_bus_socket"
    }

    /// The default fingerprint reader's name (fprintd's Device `name` property), e.g.
    /// "Virtual device for debugging"; nil when there is no bus, no fprintd or no reader.
    public static func readerDescription(busAddress: String? = nil, timeoutMilliseconds: Int = 2000) -> String? {
        guard let bus = DBusConnection(address: busAddress ?? systemBusAddress(), timeoutMilliseconds: timeoutMilliseconds),
              let device = bus.defaultDevice() else { return nil }
        defer { bus.close() }
        guard let reply = bus.call(destination: fprint, path: device, interface: "org.freedesktop.DBus.Properties",
                                   member: "Get", body: .strings(["net.reactivated.Fprint.Device", "name"])),
              reply.error == nil, reply.signature == "v" else { return nil }
        var r = DBusReader(reply.body)
        guard let sig = r.signature(), sig == "s" else { return nil }
        return r.string()
    }

    static let fprint = "net.reactivated.Fprint"
}

struct DBusReply {
    var signature: String
    var body: [UInt8]
    var error: String?
}

enum DBusBody {
    case none
    case strings([String])
}

/// One authenticated connection to a bus. Blocking I/O with socket timeouts.
final class DBusConnection {
    private var fd: Int32
    private var serial: UInt32 = 0
    static let maxMessageBytes = 1 << 20

    init?(address: String, timeoutMilliseconds: Int) {
        // Only "unix:path=..." (what dbus-daemon and our test bus print); take the first of
        // ';'-separated addresses and ignore extra keys such as guid=.
        guard let first = address.split(separator: ";").first, first.hasPrefix("unix:") else { return nil }
        var path: String?
        for kv in first.dropFirst(5).split(separator: ",") where kv.hasPrefix("path=") {
            path = String(kv.dropFirst(5))
        }
        guard let path, !path.isEmpty, path.utf8.count < 108 else { return nil }
        fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return nil }
        var tv = timeval(tv_sec: timeoutMilliseconds / 1000, tv_usec: (timeoutMilliseconds % 1000) * 1000)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        let connected = ckh_connect_unix(fd, path)
        guard connected == 0, authenticate(), hello() else { close(); return nil }
    }

    deinit { close() }

    func close() {
        if fd >= 0 { _ = Glibc.close(fd); fd = -1 }
    }

    /// SASL EXTERNAL: the bus checks our uid through SO_PEERCRED.
    private func authenticate() -> Bool {
        let uid = Array(String(getuid()).utf8)
        let hex = Hex.encode(uid)
        guard send([0] + Array("AUTH EXTERNAL \(hex)\r\n".utf8)), let line = readLine(), line.hasPrefix("OK ") else {
            return false
        }
        return send(Array("BEGIN\r\n".utf8))
    }

    private func hello() -> Bool {
        guard let r = call(destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus",
                           interface: "org.freedesktop.DBus", member: "Hello", body: .none) else { return false }
        return r.error == nil
    }

    func defaultDevice() -> String? {
        guard let r = call(destination: BiometryReader.fprint, path: "/net/reactivated/Fprint/Manager",
                           interface: "net.reactivated.Fprint.Manager", member: "GetDefaultDevice", body: .none),
              r.error == nil, r.signature == "o" else { return nil }
        var reader = DBusReader(r.body)
        return reader.string()
    }

    /// Sends one method call and returns its reply, skipping signals and other traffic.
    func call(destination: String, path: String, interface: String, member: String, body: DBusBody) -> DBusReply? {
        serial &+= 1
        let mySerial = serial
        var b = DBusWriter()
        var signature = ""
        if case .strings(let ss) = body {
            for s in ss { b.string(s); signature += "s" }
        }
        var h = DBusWriter()
        h.bytes([UInt8(ascii: "l"), 1, 0, 1])
        h.uint32(UInt32(b.data.count))
        h.uint32(mySerial)
        var fields = DBusWriter(offset: 16)
        fields.field(1, "o", path)
        fields.field(2, "s", interface)
        fields.field(3, "s", member)
        fields.field(6, "s", destination)
        if !signature.isEmpty { fields.field(8, "g", signature) }
        h.uint32(UInt32(fields.data.count))
        h.bytes(fields.data)
        h.pad(to: 8)
        guard send(h.data + b.data) else { return nil }
        for _ in 0..<64 {
            guard let m = readMessage() else { return nil }
            if m.replySerial == mySerial && (m.type == 2 || m.type == 3) {
                return DBusReply(signature: m.signature, body: m.body, error: m.type == 3 ? (m.errorName ?? "") : nil)
            }
        }
        return nil
    }

    private struct Message {
        var type: UInt8
        var replySerial: UInt32?
        var signature: String
        var errorName: String?
        var body: [UInt8]
    }

    private func readMessage() -> Message? {
        guard let fixed = readExactly(16), fixed[0] == UInt8(ascii: "l"), fixed[3] == 1 else { return nil }
        let bodyLength = Int(le32(fixed, 4))
        let fieldsLength = Int(le32(fixed, 12))
        guard bodyLength <= Self.maxMessageBytes, fieldsLength <= Self.maxMessageBytes else { return nil }
        let headerPadded = (16 + fieldsLength + 7) & ~7
        guard let rest = readExactly(headerPadded - 16 + bodyLength) else { return nil }
        let header = fixed + rest.prefix(headerPadded - 16)
        var m = Message(type: fixed[1], replySerial: nil, signature: "", errorName: nil,
                        body: Array(rest.suffix(bodyLength)))
        var r = DBusReader(Array(header), start: 16, end: 16 + fieldsLength)
        while !r.atEnd {
            guard r.align(8), let code = r.byte(), let sig = r.signature() else { return nil }
            switch (code, sig) {
            case (4, "s"): guard let s = r.string() else { return nil }; m.errorName = s
            case (5, "u"): guard let u = r.uint32() else { return nil }; m.replySerial = u
            case (8, "g"): guard let g = r.signature() else { return nil }; m.signature = g
            case (_, "s"), (_, "o"): guard r.string() != nil else { return nil }
            case (_, "g"): guard r.signature() != nil else { return nil }
            case (_, "u"): guard r.uint32() != nil else { return nil }
            default: return nil
            }
        }
        return m
    }

    private func send(_ bytes: [UInt8]) -> Bool {
        bytes.withUnsafeBytes { DescriptorIO.writeAll(fd, $0, socket: true) == 0 }
    }

    private func readExactly(_ count: Int) -> [UInt8]? {
        var out = [UInt8](repeating: 0, count: count)
        var got = 0
        while got < count {
            let n = out.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress! + got, count - got) }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { return nil }
            got += n
        }
        return out
    }

    /// One "\r\n"-terminated SASL line, at most 512 bytes.
    private func readLine() -> String? {
        var line: [UInt8] = []
        while line.count < 512 {
            guard let b = readExactly(1) else { return nil }
            line.append(b[0])
            if line.count >= 2 && line.suffix(2) == [13, 10] {
                return String(decoding: line.dropLast(2), as: UTF8.self)
            }
        }
        return nil
    }
}

private func le32(_ b: [UInt8], _ i: Int) -> UInt32 {
    UInt32(b[i]) | UInt32(b[i + 1]) << 8 | UInt32(b[i + 2]) << 16 | UInt32(b[i + 3]) << 24
}

/// Little-endian D-Bus marshalling; `offset` is where `data` starts in the whole message,
/// because alignment is relative to the message start.
struct DBusWriter {
    var data: [UInt8] = []
    let offset: Int
    init(offset: Int = 0) { self.offset = offset }

    mutating func pad(to n: Int) { while (offset + data.count) % n != 0 { data.append(0) } }
    mutating func bytes(_ b: [UInt8]) { data += b }
    mutating func uint32(_ v: UInt32) {
        pad(to: 4)
        data += [UInt8(v & 0xff), UInt8(v >> 8 & 0xff), UInt8(v >> 16 & 0xff), UInt8(v >> 24)]
    }
    mutating func string(_ s: String) {
        let u = Array(s.utf8)
        uint32(UInt32(u.count))
        data += u + [0]
    }
    mutating func signature(_ s: String) {
        let u = Array(s.utf8)
        data.append(UInt8(u.count))
        data += u + [0]
    }
    /// One header field: struct (byte code, variant) aligned to 8.
    mutating func field(_ code: UInt8, _ sig: String, _ value: String) {
        pad(to: 8)
        data.append(code)
        signature(sig)
        if sig == "g" { signature(value) } else { string(value) }
    }
}

/// Bounds-checked little-endian D-Bus unmarshalling: every read returns nil past the end.
struct DBusReader {
    private let b: [UInt8]
    private var i: Int
    private let end: Int

    init(_ bytes: [UInt8], start: Int = 0, end: Int? = nil) {
        b = bytes
        i = start
        self.end = min(end ?? bytes.count, bytes.count)
    }

    var atEnd: Bool { i >= end }

    mutating func align(_ n: Int) -> Bool {
        let next = (i + n - 1) / n * n
        guard next <= end else { return false }
        i = next
        return true
    }

    mutating func byte() -> UInt8? {
        guard i < end else { return nil }
        defer { i += 1 }
        return b[i]
    }

    mutating func uint32() -> UInt32? {
        guard align(4), i + 4 <= end else { return nil }
        defer { i += 4 }
        return le32(b, i)
    }

    mutating func string() -> String? {
        guard let n = uint32().map(Int.init), n <= end - i - 1, b[i + n] == 0 else { return nil }
        defer { i += n + 1 }
        return String(decoding: b[i..<(i + n)], as: UTF8.self)
    }

    mutating func signature() -> String? {
        guard let n = byte().map(Int.init), n <= end - i - 1, b[i + n] == 0 else { return nil }
        defer { i += n + 1 }
        return String(decoding: b[i..<(i + n)], as: UTF8.self)
    }

}
