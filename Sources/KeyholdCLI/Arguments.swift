/// Hand-written argument parsing for `keyhold` (no outside packages may be fetched). Small on
/// purpose: commands with positionals, `--option VALUE` / `--option=VALUE`, flags, repeatable
/// options, `--` to end options, and `--help` everywhere.
public struct OptionSpec: Sendable {
    public let name: String
    public let value: String?       // placeholder shown in help; nil = a flag
    public let repeatable: Bool
    public let help: String

    public init(_ name: String, value: String? = nil, repeatable: Bool = false, help: String) {
        self.name = name
        self.value = value
        self.repeatable = repeatable
        self.help = help
    }
}

public struct CommandSpec: Sendable {
    public let name: String
    public let positionals: [String]
    public let options: [OptionSpec]
    public let summary: String
    /// Sub-commands (e.g. `audit verify`), each a command of its own.
    public let subcommands: [CommandSpec]

    public init(_ name: String, positionals: [String] = [], options: [OptionSpec] = [], summary: String,
                subcommands: [CommandSpec] = []) {
        self.name = name
        self.positionals = positionals
        self.options = options
        self.summary = summary
        self.subcommands = subcommands
    }

    public var usage: String {
        var line = "usage: keyhold \(name)"
        for p in positionals { line += " \(p)" }
        for o in options { line += o.value.map { " [\(o.name) \($0)]" } ?? " [\(o.name)]" }
        var text = line + "\n\n" + summary + "\n"
        if !options.isEmpty {
            text += "\n"
            for o in options {
                let left = o.value.map { "\(o.name) \($0)" } ?? o.name
                text += "  " + left.padded(to: 24) + o.help + (o.repeatable ? " (repeatable)" : "") + "\n"
            }
        }
        if !subcommands.isEmpty {
            text += "\n"
            for s in subcommands { text += "  keyhold \(s.name)".padded(to: 26) + s.summary.split(separator: "\n").first.map(String.init)! + "\n" }
        }
        return text
    }
}

public struct ParsedCommand: Equatable, Sendable {
    public let name: String
    public let positionals: [String]
    public let values: [String: [String]]
    public let flags: Set<String>

    public func value(_ option: String) -> String? { values[option]?.last }
    public func all(_ option: String) -> [String] { values[option] ?? [] }
    public func flag(_ option: String) -> Bool { flags.contains(option) }
}

public enum ArgumentError: Error, Equatable, CustomStringConvertible {
    case noCommand
    case unknownCommand(String)
    case unknownOption(command: String, option: String)
    case missingValue(String)
    case unexpectedValue(String)
    case repeated(String)
    case wrongPositionals(command: String, expected: [String])
    /// `--help` was asked for; the payload is the text to print on stdout.
    case help(String)

    public var description: String {
        switch self {
        case .noCommand: "no command given (try: keyhold --help)"
        case .unknownCommand(let c): "unknown command '\(c)' (try: keyhold --help)"
        case .unknownOption(let c, let o): "unknown option '\(o)' for '\(c)'"
        case .missingValue(let o): "option \(o) needs a value"
        case .unexpectedValue(let o): "option \(o) takes no value"
        case .repeated(let o): "option \(o) given twice"
        case .wrongPositionals(let c, let e):
            e.isEmpty ? "'\(c)' takes no arguments" : "'\(c)' needs \(e.joined(separator: " "))"
        case .help(let text): text
        }
    }
}

public struct ArgumentParser: Sendable {
    public let commands: [CommandSpec]
    public let globalOptions: [OptionSpec]
    public let overview: String

    public init(commands: [CommandSpec], globalOptions: [OptionSpec], overview: String) {
        self.commands = commands
        self.globalOptions = globalOptions
        self.overview = overview
    }

    /// Parses `arguments` (without the program name) into global values and one command.
    public func parse(_ arguments: [String]) throws(ArgumentError) -> (globals: [String: String], command: ParsedCommand) {
        var globals: [String: String] = [:]
        var i = 0
        while i < arguments.count, arguments[i].hasPrefix("-") {
            let (name, inline) = Self.split(arguments[i])
            if name == "--help" || name == "-h" { throw .help(mainUsage) }
            guard let spec = globalOptions.first(where: { $0.name == name }) else {
                throw .unknownOption(command: "keyhold", option: name)
            }
            guard globals[name] == nil else { throw .repeated(name) }
            if let inline { globals[name] = inline } else {
                i += 1
                guard i < arguments.count else { throw .missingValue(spec.name) }
                globals[name] = arguments[i]
            }
            i += 1
        }
        guard i < arguments.count else { throw .noCommand }
        guard var spec = commands.first(where: { $0.name == arguments[i] }) else { throw .unknownCommand(arguments[i]) }
        i += 1
        // `audit verify`, `audit export`, …: a sub-command word right after the command.
        if i < arguments.count, let sub = spec.subcommands.first(where: { $0.name == "\(spec.name) \(arguments[i])" }) {
            spec = sub
            i += 1
        }
        return (globals, try parse(Array(arguments[i...]), as: spec))
    }

    func parse(_ arguments: [String], as spec: CommandSpec) throws(ArgumentError) -> ParsedCommand {
        var positionals: [String] = []
        var values: [String: [String]] = [:]
        var flags = Set<String>()
        var i = 0
        var optionsEnded = false
        while i < arguments.count {
            let arg = arguments[i]
            if !optionsEnded && arg == "--" {
                optionsEnded = true
            } else if !optionsEnded && arg.hasPrefix("-") && arg.count > 1 {
                let (name, inline) = Self.split(arg)
                if name == "--help" || name == "-h" { throw .help(spec.usage) }
                guard let option = spec.options.first(where: { $0.name == name }) else {
                    throw .unknownOption(command: spec.name, option: name)
                }
                if option.value == nil {
                    guard inline == nil else { throw .unexpectedValue(name) }
                    guard !flags.contains(name) else { throw .repeated(name) }
                    flags.insert(name)
                } else {
                    let value: String
                    if let inline { value = inline } else {
                        i += 1
                        guard i < arguments.count else { throw .missingValue(name) }
                        value = arguments[i]
                    }
                    if values[name] != nil && !option.repeatable { throw .repeated(name) }
                    values[name, default: []].append(value)
                }
            } else {
                positionals.append(arg)
            }
            i += 1
        }
        guard positionals.count == spec.positionals.count else {
            throw .wrongPositionals(command: spec.name, expected: spec.positionals)
        }
        return ParsedCommand(name: spec.name, positionals: positionals, values: values, flags: flags)
    }

    public var mainUsage: String {
        var text = "usage: keyhold"
        for o in globalOptions { text += o.value.map { " [\(o.name) \($0)]" } ?? " [\(o.name)]" }
        text += " COMMAND ...\n\n\(overview)\n\ncommands:\n"
        for c in commands { text += "  " + c.name.padded(to: 12) + (c.summary.split(separator: "\n").first.map(String.init) ?? "") + "\n" }
        text += "\nRun 'keyhold COMMAND --help' for a command's options.\n"
        return text
    }

    static func split(_ arg: String) -> (String, String?) {
        guard arg.hasPrefix("--"), let eq = arg.firstIndex(of: "=") else { return (arg, nil) }
        return (String(arg[..<eq]), String(arg[arg.index(after: eq)...]))
    }
}

extension String {
    func padded(to width: Int) -> String {
        count >= width ? self + " " : self + String(repeating: " ", count: width - count)
    }
}
