/// The one way text from a caller, a peer, a module or the disk is made safe to show on a
/// terminal or in a log line. Every C0 or C1 control, DEL, byte that is not valid UTF-8,
/// format or separator character (bidi overrides and isolates, zero-width characters, BOM,
/// U+2028/2029), default-ignorable (invisible) or unassigned code point is written as an
/// escape: `\x1b` for a control or a bad byte, `\u{202e}` for the others. A backslash is
/// written `\\`, so an escape in the output is never ambiguous. What remains cannot move the
/// cursor, clear a line, change colours, reorder text or hide characters.
public enum Printable {
    /// Whether `u` is shown escaped.
    public static func needsEscape(_ u: Unicode.Scalar) -> Bool {
        let v = u.value
        if v < 0x20 || (0x7f...0x9f).contains(v) { return true }
        if v < 0x7f { return false }
        switch u.properties.generalCategory {
        case .control, .format, .lineSeparator, .paragraphSeparator, .unassigned, .surrogate: return true
        default: return u.properties.isDefaultIgnorableCodePoint
        }
    }

    /// `text` escaped; with `limit`, at most that many characters shown (escapes count in
    /// full and are never cut), then `…`.
    /// `escapingSpaces` also escapes the space, for log fields separated by spaces.
    public static func escape(_ text: String, limit: Int? = nil, escapingSpaces: Bool = false) -> String {
        escape(bytes: text.utf8, limit: limit, escapingSpaces: escapingSpaces)
    }

    /// As `escape(_:)`, for bytes that may not be valid UTF-8: each bad byte becomes `\xNN`.
    public static func escape<Bytes: Collection<UInt8>>(bytes: Bytes, limit: Int? = nil, escapingSpaces: Bool = false) -> String {
        let bytes = Array(bytes)
        // Fast path: plain ASCII that needs nothing.
        if limit.map({ bytes.count <= $0 }) ?? true,
           !bytes.contains(where: { $0 < 0x20 || $0 >= 0x7f || $0 == 0x5c || (escapingSpaces && $0 == 0x20) }) {
            return String(decoding: bytes, as: UTF8.self)
        }
        var out = String.UnicodeScalarView()
        var shown = 0
        func hex(_ value: UInt32, digits: Int) -> String {
            let h = String(value, radix: 16)
            return String(repeating: "0", count: max(0, digits - h.count)) + h
        }
        /// False when `piece` would go past `limit`: then the text ends with `…`.
        func append(_ piece: String.UnicodeScalarView) -> Bool {
            if let limit, shown + piece.count > limit {
                out.append("…")
                return false
            }
            out.append(contentsOf: piece)
            shown += piece.count
            return true
        }
        var parser = Unicode.UTF8.ForwardParser()
        var iterator = bytes.makeIterator()
        var position = 0
        parsing: while true {
            switch parser.parseScalar(from: &iterator) {
            case .valid(let encoded):
                position += encoded.count
                let u = Unicode.UTF8.decode(encoded)
                let piece: String
                if u == "\\" {
                    piece = "\\\\"
                } else if u.value < 0x20 || (0x7f...0x9f).contains(u.value) || (escapingSpaces && u == " ") {
                    piece = "\\x" + hex(u.value, digits: 2)
                } else if needsEscape(u) {
                    piece = "\\u{" + hex(u.value, digits: 4) + "}"
                } else {
                    piece = String(u)
                }
                guard append(piece.unicodeScalars) else { break parsing }
            case .error(let length):
                let piece = bytes[position..<(position + length)].map { "\\x" + hex(UInt32($0), digits: 2) }.joined()
                position += length
                guard append(piece.unicodeScalars) else { break parsing }
            case .emptyInput:
                break parsing
            }
        }
        return String(out)
    }
}
