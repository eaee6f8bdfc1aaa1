import CSystemd
import Glibc

/// A D-Bus error reply: a closed set of names the Secret Service clients know.
public enum BusError: Error, Equatable {
    case invalidArgs(String)
    case notSupported(String)
    case unknownMethod(String)
    case unknownObject(String)
    case noSession
    case noSuchObject
    case isLocked
    case accessDenied(String)
    case limitsExceeded(String)
    case failed(String)
    /// Internal, never sent: the call needs a new listing of the items first (Agent.cachedItem).
    case listingNeeded

    public var name: String {
        switch self {
        case .invalidArgs: "org.freedesktop.DBus.Error.InvalidArgs"
        case .notSupported: "org.freedesktop.DBus.Error.NotSupported"
        case .unknownMethod: "org.freedesktop.DBus.Error.UnknownMethod"
        case .unknownObject: "org.freedesktop.DBus.Error.UnknownObject"
        case .noSession: "org.freedesktop.Secret.Error.NoSession"
        case .noSuchObject: "org.freedesktop.Secret.Error.NoSuchObject"
        case .isLocked: "org.freedesktop.Secret.Error.IsLocked"
        case .accessDenied: "org.freedesktop.DBus.Error.AccessDenied"
        case .limitsExceeded: "org.freedesktop.DBus.Error.LimitsExceeded"
        case .failed, .listingNeeded: "org.freedesktop.DBus.Error.Failed"
        }
    }

    public var message: String {
        switch self {
        case .invalidArgs(let m), .notSupported(let m), .unknownMethod(let m), .unknownObject(let m),
             .accessDenied(let m), .limitsExceeded(let m), .failed(let m): m
        case .noSession: "no such session"
        case .noSuchObject: "no such object"
        case .isLocked: "the item is locked"
        case .listingNeeded: "the items could not be listed"
        }
    }
}

/// The secret a client sends or receives: (session, parameters, value, content type).
public struct WireSecret {
    public var session: String
    public var parameters: [UInt8]
    public var value: [UInt8]
    public var contentType: String
}

/// Reads the arguments of one incoming message. Every read checks the type the bus says is
/// next; anything else is InvalidArgs. The bus daemon has already validated the encoding.
struct MessageReader {
    let m: OpaquePointer

    func requireSignature(_ signature: String) throws(BusError) {
        guard sd_bus_message_has_signature(m, signature) > 0 else {
            throw .invalidArgs("expected arguments of signature \(signature)")
        }
    }

    func basicString(_ type: UInt8) throws(BusError) -> String {
        var p: UnsafePointer<CChar>?
        let r = withUnsafeMutablePointer(to: &p) { sd_bus_message_read_basic(m, CChar(bitPattern: type), $0) }
        guard r > 0, let p else { throw .invalidArgs("bad argument") }
        return String(cString: p)
    }

    func string() throws(BusError) -> String { try basicString(UInt8(ascii: "s")) }
    func objectPath() throws(BusError) -> String { try basicString(UInt8(ascii: "o")) }

    func uint32() throws(BusError) -> UInt32 {
        var v: UInt32 = 0
        guard sd_bus_message_read_basic(m, CChar(UInt8(ascii: "u")), &v) > 0 else { throw .invalidArgs("bad uint32") }
        return v
    }

    func bool() throws(BusError) -> Bool {
        var v: Int32 = 0
        guard sd_bus_message_read_basic(m, CChar(UInt8(ascii: "b")), &v) > 0 else { throw .invalidArgs("bad boolean") }
        return v != 0
    }

    /// `ay`, at most `limit` bytes.
    func bytes(limit: Int) throws(BusError) -> [UInt8] {
        var p: UnsafeRawPointer?
        var n = 0
        guard sd_bus_message_read_array(m, CChar(UInt8(ascii: "y")), &p, &n) >= 0 else { throw .invalidArgs("bad byte array") }
        guard n <= limit else { throw .limitsExceeded("byte array above \(limit) bytes") }
        guard n > 0, let p else { return [] }
        return Array(UnsafeRawBufferPointer(start: p, count: n))
    }

    func enter(_ type: UInt8, _ contents: String) throws(BusError) -> Bool {
        let r = sd_bus_message_enter_container(m, CChar(bitPattern: type), contents)
        guard r >= 0 else { throw .invalidArgs("expected \(Character(UnicodeScalar(type)))\(contents)") }
        return r > 0
    }

    func exit() throws(BusError) {
        guard sd_bus_message_exit_container(m) >= 0 else { throw .invalidArgs("bad container") }
    }

    func skip(_ signature: String) throws(BusError) {
        guard sd_bus_message_skip(m, signature) >= 0 else { throw .invalidArgs("bad argument") }
    }

    /// `ao`, at most `limit` entries.
    func objectPaths(limit: Int) throws(BusError) -> [String] {
        guard try enter(UInt8(ascii: "a"), "o") else { throw .invalidArgs("expected ao") }
        var out: [String] = []
        while true {
            var p: UnsafePointer<CChar>?
            let r = withUnsafeMutablePointer(to: &p) { sd_bus_message_read_basic(m, CChar(UInt8(ascii: "o")), $0) }
            guard r >= 0 else { throw .invalidArgs("bad object path") }
            guard r > 0, let p else { break }
            guard out.count < limit else { throw .limitsExceeded("more than \(limit) objects") }
            out.append(String(cString: p))
        }
        try exit()
        return out
    }

    /// `a{ss}`, at most `limit` pairs of at most `maxBytes` each; a repeated key is refused.
    func stringMap(limit: Int, maxBytes: Int) throws(BusError) -> [String: String] {
        guard try enter(UInt8(ascii: "a"), "{ss}") else { throw .invalidArgs("expected a{ss}") }
        var out: [String: String] = [:]
        while try enter(UInt8(ascii: "e"), "ss") {
            let k = try string(), v = try string()
            try exit()
            guard out.count < limit else { throw .limitsExceeded("more than \(limit) attributes") }
            guard k.utf8.count <= maxBytes, v.utf8.count <= maxBytes else { throw .limitsExceeded("attribute above \(maxBytes) bytes") }
            guard out[k] == nil else { throw .invalidArgs("attribute \(k) given twice") }
            out[k] = v
        }
        try exit()
        return out
    }

    /// The signature of the next value inside a variant, entering it; nil if the next is not `v`.
    func enterVariant() throws(BusError) -> String? {
        var type: CChar = 0
        var contents: UnsafePointer<CChar>?
        guard sd_bus_message_peek_type(m, &type, &contents) > 0, type == CChar(UInt8(ascii: "v")), let contents else { return nil }
        let sig = String(cString: contents)
        guard try enter(UInt8(ascii: "v"), sig) else { return nil }
        return sig
    }

    /// `(oayays)`.
    func secret(maxValueBytes: Int) throws(BusError) -> WireSecret {
        guard try enter(UInt8(ascii: "r"), "oayays") else { throw .invalidArgs("expected a secret (oayays)") }
        let session = try objectPath()
        let parameters = try bytes(limit: 256)
        let value = try bytes(limit: maxValueBytes)
        let contentType = try string()
        try exit()
        guard contentType.utf8.count <= 255 else { throw .limitsExceeded("content type too long") }
        return WireSecret(session: session, parameters: parameters, value: value, contentType: contentType)
    }
}

/// Builds one outgoing message.
struct MessageWriter {
    let m: OpaquePointer

    func string(_ s: String) { _ = sd_bus_message_append_basic(m, CChar(UInt8(ascii: "s")), s) }
    func objectPath(_ s: String) { _ = sd_bus_message_append_basic(m, CChar(UInt8(ascii: "o")), s) }
    func bool(_ b: Bool) {
        var v: Int32 = b ? 1 : 0
        _ = sd_bus_message_append_basic(m, CChar(UInt8(ascii: "b")), &v)
    }
    func uint64(_ x: UInt64) {
        var v = x
        _ = sd_bus_message_append_basic(m, CChar(UInt8(ascii: "t")), &v)
    }
    func bytes(_ b: [UInt8]) {
        _ = b.withUnsafeBytes { sd_bus_message_append_array(m, CChar(UInt8(ascii: "y")), $0.baseAddress, $0.count) }
    }
    func open(_ type: UInt8, _ contents: String) { _ = sd_bus_message_open_container(m, CChar(bitPattern: type), contents) }
    func close() { _ = sd_bus_message_close_container(m) }

    func objectPaths(_ paths: [String]) {
        open(UInt8(ascii: "a"), "o")
        for p in paths { objectPath(p) }
        close()
    }

    func stringMap(_ map: [String: String]) {
        open(UInt8(ascii: "a"), "{ss}")
        for (k, v) in map.sorted(by: { $0.key < $1.key }) {
            open(UInt8(ascii: "e"), "ss")
            string(k)
            string(v)
            close()
        }
        close()
    }

    func secret(_ s: WireSecret) {
        open(UInt8(ascii: "r"), "oayays")
        objectPath(s.session)
        bytes(s.parameters)
        bytes(s.value)
        string(s.contentType)
        close()
    }

    /// A variant holding `signature`, written by `body`.
    func variant(_ signature: String, _ body: () -> Void) {
        open(UInt8(ascii: "v"), signature)
        body()
        close()
    }
}
