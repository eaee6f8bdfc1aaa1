/// An item's access-control policy, mirroring `SecAccessControlCreateFlags`.
///
/// Written as an expression: one constraint, or several joined by a single combinator
/// (`or` / `and`, as Apple allows only one per policy), optionally followed by
/// `+app-password`. Examples: `none`, `user-presence`, `biometry-current-set or device-passcode`,
/// `device-passcode+app-password`.
public struct Policy: Sendable, Equatable, CustomStringConvertible {
    public enum Constraint: String, Sendable, CaseIterable {
        case userPresence = "user-presence"
        case biometryAny = "biometry-any"
        case biometryCurrentSet = "biometry-current-set"
        case devicePasscode = "device-passcode"

        public var isBiometric: Bool { self == .biometryAny || self == .biometryCurrentSet }
        /// True when a fingerprint can satisfy it (biometric, or user presence when enrolled).
        public var acceptsFingerprint: Bool { isBiometric || self == .userPresence }
    }

    public enum Combinator: String, Sendable {
        case or, and
    }

    /// Empty for `none` (or an app password alone).
    public let constraints: [Constraint]
    public let combinator: Combinator
    public let requiresAppPassword: Bool

    public static let none = Policy(constraints: [], combinator: .or, requiresAppPassword: false)

    public init(constraints: [Constraint], combinator: Combinator = .or, requiresAppPassword: Bool = false) {
        self.constraints = constraints
        self.combinator = constraints.count > 1 ? combinator : .or
        self.requiresAppPassword = requiresAppPassword
    }

    /// True when releasing needs a PAM authentication (not counting the app password).
    public var requiresAuthentication: Bool { !constraints.isEmpty }
    /// True when the item is bound to the enrolled fingerprint set.
    public var bindsBiometrySet: Bool { constraints.contains(.biometryCurrentSet) }

    public enum ParseError: Error, Equatable, CustomStringConvertible {
        case empty
        case unknownWord(String)
        case mixedCombinators
        case misplacedWord(String)

        public var description: String {
            switch self {
            case .empty: "empty policy expression"
            case .unknownWord(let w): "unknown policy word '\(w)'"
            case .mixedCombinators: "a policy may use only one of 'or' and 'and'"
            case .misplacedWord(let w): "misplaced policy word '\(w)'"
            }
        }
    }

    /// Parses an expression. The error names the first bad word.
    public init(parsing text: String) throws(ParseError) {
        // `+app-password` may be glued to the last word or stand alone.
        var spaced = ""
        for ch in text { if ch == "+" { spaced += " + " } else { spaced.append(ch) } }
        let words = spaced.split(whereSeparator: { $0 == " " || $0 == "\t" }).map(String.init)
        guard !words.isEmpty else { throw .empty }

        var constraints: [Constraint] = []
        var combinator: Combinator?
        var appPassword = false
        var sawNone = false
        var expectConstraint = true
        var index = 0
        while index < words.count {
            let word = words[index]
            if word == "+" {
                guard index + 1 < words.count else { throw .misplacedWord("+") }
                let next = words[index + 1]
                guard next == "app-password" else { throw .unknownWord(next) }
                guard !appPassword, !expectConstraint, index + 2 == words.count else { throw .misplacedWord("app-password") }
                appPassword = true
                index += 2
                continue
            }
            if expectConstraint {
                if word == "none" {
                    guard constraints.isEmpty, combinator == nil else { throw .misplacedWord(word) }
                    sawNone = true
                } else if word == "app-password" {
                    // An application password alone (`.applicationPassword` without other flags).
                    guard index == 0, words.count == 1 else { throw .misplacedWord(word) }
                    appPassword = true
                } else if let c = Constraint(rawValue: word) {
                    guard !sawNone else { throw .misplacedWord(word) }
                    guard !constraints.contains(c) else { throw .misplacedWord(word) }
                    constraints.append(c)
                } else if Combinator(rawValue: word) != nil {
                    throw .misplacedWord(word)
                } else {
                    throw .unknownWord(word)
                }
                expectConstraint = false
            } else {
                guard let c = Combinator(rawValue: word) else {
                    if Constraint(rawValue: word) != nil || word == "none" { throw .misplacedWord(word) }
                    throw .unknownWord(word)
                }
                guard !sawNone else { throw .misplacedWord(word) }
                if let existing = combinator, existing != c { throw .mixedCombinators }
                combinator = c
                expectConstraint = true
            }
            index += 1
        }
        if expectConstraint { throw .misplacedWord(words.last ?? "") }
        self.init(constraints: constraints, combinator: combinator ?? .or, requiresAppPassword: appPassword)
    }

    /// The canonical expression; what is stored and bound into the associated data.
    public var description: String {
        var text: String
        if constraints.isEmpty {
            text = requiresAppPassword ? "app-password" : "none"
            return text
        }
        text = constraints.map(\.rawValue).joined(separator: " \(combinator.rawValue) ")
        if requiresAppPassword { text += "+app-password" }
        return text
    }
}
