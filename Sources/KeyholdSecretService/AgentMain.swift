import CKeyholdSS
import CSystemd
import Glibc
import KeyholdCore

/// Startup failures: each has one message and exit status 1 (usage: 2).
public enum AgentStartError: Error, Equatable {
    case usage(String)
    case runningAsRoot
    case noBus(String)
    case nameOwned
    case nameRequest(String)
    case noWakeup

    public var message: String {
        switch self {
        case .usage(let m): m
        case .runningAsRoot: "keyhold-secret-service runs as the user whose items it serves, never as root"
        case .noBus(let m): "cannot connect to the session bus: \(m)"
        case .nameOwned: "org.freedesktop.secrets is already owned by another program (stop it, or pass --replace)"
        case .nameRequest(let m): "cannot own org.freedesktop.secrets: \(m)"
        case .noWakeup: "cannot create the event loop's wake-up descriptor (eventfd)"
        }
    }

    public var exitStatus: Int32 { if case .usage = self { 2 } else { 1 } }
}

extension AgentOptions {
    public static let usage = "usage: keyhold-secret-service [--socket PATH] [--default-policy EXPR] [--reuse SECONDS] [--replace]"

    public static func parse(_ args: [String]) throws(AgentStartError) -> AgentOptions {
        var o = AgentOptions()
        var i = 0
        func value() throws(AgentStartError) -> String {
            i += 1
            guard i < args.count else { throw .usage("\(args[i - 1]) needs a value\n\(usage)") }
            return args[i]
        }
        while i < args.count {
            switch args[i] {
            case "--socket": o.socketPath = try value()
            case "--default-policy":
                let text = try value()
                do throws(Policy.ParseError) { o.defaultPolicy = try Policy(parsing: text) } catch { throw .usage(error.description) }
                if o.defaultPolicy.requiresAppPassword { throw .usage("an application password cannot be asked over D-Bus") }
            case "--reuse":
                guard let s = UInt32(try value()), s <= Limits.maxReuseSeconds else {
                    throw .usage("--reuse takes 0 to \(Limits.maxReuseSeconds) seconds")
                }
                o.reuseSeconds = s
            case "--replace": o.replace = true
            case "-h", "--help": throw .usage(usage)
            default: throw .usage("unknown argument \(args[i])\n\(usage)")
            }
            i += 1
        }
        return o
    }
}

/// Flags the bus callbacks set for the loop.
final class LoopFlags {
    var nameLost = false
}

private let methodHandler: sd_bus_message_handler_t = { m, userdata, retError in
    guard let m, let userdata else { return 0 }
    let agent = Unmanaged<Agent>.fromOpaque(userdata).takeUnretainedValue()
    do throws(BusError) {
        return try agent.dispatch(m) ? 1 : 0
    } catch {
        return sd_bus_error_set(retError, error.name, error.message)
    }
}

private let ownerChanged: sd_bus_message_handler_t = { m, userdata, _ in
    guard let m, let userdata else { return 0 }
    let agent = Unmanaged<Agent>.fromOpaque(userdata).takeUnretainedValue()
    let r = MessageReader(m: m)
    guard let name = try? r.string(), let _ = try? r.string(), let new = try? r.string() else { return 0 }
    if new.isEmpty && name.hasPrefix(":") { agent.state.forget(client: name) }
    return 0
}

private let nameLost: sd_bus_message_handler_t = { _, userdata, _ in
    guard let userdata else { return 0 }
    Unmanaged<LoopFlags>.fromOpaque(userdata).takeUnretainedValue().nameLost = true
    return 0
}

extension Agent {
    /// Owns the name and serves until SIGTERM, the bus going away, or the name being taken
    /// over (`--replace` elsewhere). Returns the exit status.
    public static func run(_ options: AgentOptions) throws(AgentStartError) -> Int32 {
        guard getuid() != 0, geteuid() != 0 else { throw .runningAsRoot }
        ckss_install_termination_handler()
        var busOut: OpaquePointer?
        let rc = sd_bus_open_user(&busOut)
        guard rc >= 0, let bus = busOut else { throw .noBus(String(cString: strerror(-rc))) }
        defer { sd_bus_flush_close_unref(bus) }

        guard let inbox = LoopInbox() else { throw .noWakeup }
        let agent = Agent(bus: bus, options: options, inbox: inbox)
        let flags = LoopFlags()
        let agentPtr = Unmanaged.passUnretained(agent).toOpaque()
        let flagsPtr = Unmanaged.passUnretained(flags).toOpaque()
        guard sd_bus_add_fallback(bus, nil, SecretObject.servicePath, methodHandler, agentPtr) >= 0,
              sd_bus_match_signal(bus, nil, "org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus",
                                  "NameOwnerChanged", ownerChanged, agentPtr) >= 0,
              sd_bus_match_signal(bus, nil, "org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus",
                                  "NameLost", nameLost, flagsPtr) >= 0 else {
            throw .noBus("cannot register the objects")
        }
        var nameFlags = UInt64(SD_BUS_NAME_ALLOW_REPLACEMENT)
        if options.replace { nameFlags |= UInt64(SD_BUS_NAME_REPLACE_EXISTING) }
        let req = sd_bus_request_name(bus, "org.freedesktop.secrets", nameFlags)
        if req == -EEXIST { throw .nameOwned }
        guard req >= 0 else { throw .nameRequest(String(cString: strerror(-req))) }

        agent.serve(flags)
        withExtendedLifetime(agent) {}
        withExtendedLifetime(flags) {}
        return 0
    }
}
