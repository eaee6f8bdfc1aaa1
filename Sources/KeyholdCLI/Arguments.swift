import KeyholdCore

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

    /// The command's help, filled to the terminal's width (`TextWidth.help`): nothing cut.
    public var usage: String { usage(width: TextWidth.help) }

    public func usage(width: Int) -> String {
        var words = positionals
        for o in options { words.append(o.value.map { "[\(o.name) \($0)]" } ?? "[\(o.name)]") }
        if name == RotateCommand.spec.name { words.append("-- COMMAND [ARGS...]") }
        let head = "usage: keyhold \(name)"
        let wrapped = TextWidth.usageWords(words, width: width, firstIndent: head.count + 1)
        var text = head + (wrapped.isEmpty || wrapped.hasPrefix("\n") ? "" : " ") + wrapped + "\n\n"
        text += TextWidth.wrap(summary, width: width) + "\n"
        let leftWidth = min(28, max(16, width / 3))
        if !options.isEmpty {
            text += "\n"
            for o in options {
                let left = o.value.map { "\(o.name) \($0)" } ?? o.name
                text += TextWidth.entry(left, leftWidth: leftWidth, o.help + (o.repeatable ? " (repeatable)" : ""), width: width)
            }
        }
        if !subcommands.isEmpty {
            text += "\n"
            for s in subcommands {
                text += TextWidth.entry("keyhold \(s.name)", leftWidth: leftWidth, firstSentence(s.summary), width: width)
            }
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
            if name == "--version" { throw .help("keyhold \(KeyholdVersion.string)\n") }
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
        if arguments[i] == "help" { throw .help(try help(Array(arguments[(i + 1)...]))) }
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

    /// `keyhold --help`: every command with the first sentence of its summary, whole.
    public var mainUsage: String { mainUsage(width: TextWidth.help) }

    public func mainUsage(width: Int) -> String {
        var words = globalOptions.map { o in o.value.map { "[\(o.name) \($0)]" } ?? "[\(o.name)]" }
        words += ["COMMAND", "[ARGS...]"]
        var text = "usage: keyhold " + TextWidth.usageWords(words, width: width, firstIndent: 15) + "\n"
        text += "       keyhold help [COMMAND]\n       keyhold --version\n\n"
        text += TextWidth.wrap(overview, width: width) + "\n\ncommands:\n"
        let leftWidth = min(18, max(16, width / 4))
        for c in commands { text += TextWidth.entry(c.name, leftWidth: leftWidth, firstSentence(c.summary), width: width) }
        text += TextWidth.entry("help", leftWidth: leftWidth, "Shows this overview, or a command's options: keyhold help COMMAND.", width: width)
        text += "\noptions:\n"
        for o in globalOptions {
            text += TextWidth.entry(o.value.map { "\(o.name) \($0)" } ?? o.name, leftWidth: leftWidth, o.help, width: width)
        }
        text += TextWidth.entry("--version", leftWidth: leftWidth, "prints the version and exits", width: width)
        text += "\n" + TextWidth.wrap("Run 'keyhold help COMMAND' (or 'keyhold COMMAND --help') for a command's options.", width: width) + "\n"
        return text
    }

    /// `keyhold help [COMMAND [SUBCOMMAND]]`: the overview, or that command's help.
    func help(_ words: [String]) throws(ArgumentError) -> String {
        guard let first = words.first else { return mainUsage }
        guard words.count <= 2, var spec = commands.first(where: { $0.name == first }) else {
            throw .unknownCommand(words.joined(separator: " "))
        }
        if words.count == 2 {
            guard let sub = spec.subcommands.first(where: { $0.name == "\(first) \(words[1])" }) else {
                throw .unknownCommand(words.joined(separator: " "))
            }
            spec = sub
        }
        return spec.usage
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
