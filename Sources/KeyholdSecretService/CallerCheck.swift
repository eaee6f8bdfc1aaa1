import CSystemd
import Glibc
import KeyholdClient
import KeyholdCore
import KeyholdProtocol
import Synchronization

/// What the bus vouches for about one client connection, read once per connection: the uid
/// and pid the bus daemon took from the connecting socket (`GetConnectionCredentials`), and
/// the start time of that pid's process when the agent first saw it. dbus-daemon 1.14
/// (Debian 12) offers no ProcessFD, so the start time is what ties later calls to the process
/// that connected: a pid that now names another process no longer matches.
struct ClientCredentials {
    let uid: UInt32
    let pid: Int32
    /// nil: the process was already gone (or a zombie) when first seen.
    let startTime: UInt64?
}

/// A process's owner and start time from /proc, nil when it is gone or a zombie.
enum ProcessIdentity {
    static func read(pid: Int32) -> (uid: uid_t, startTime: UInt64)? {
        var st = Glibc.stat()
        guard pid > 0, stat("/proc/\(pid)", &st) == 0 else { return nil }
        let fd = open("/proc/\(pid)/stat", O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var buffer = [UInt8](repeating: 0, count: 4096)
        let n = Glibc.read(fd, &buffer, buffer.count)
        guard n > 0 else { return nil }
        // Fields after the last ')' (the command name before it is the process's own choice):
        // state is field 3, starttime field 22.
        let bytes = buffer[..<n]
        guard let close = bytes.lastIndex(of: UInt8(ascii: ")")) else { return nil }
        let fields = bytes[(close + 1)...].split(separator: UInt8(ascii: " "))
        guard fields.count > 19, let state = fields[0].first, state != UInt8(ascii: "Z"), state != UInt8(ascii: "X"),
              let start = UInt64(String(decoding: fields[19], as: UTF8.self)) else { return nil }
        // The owner read again after the start time: a process that exec'd a set-uid program
        // in between is seen as the other user.
        guard stat("/proc/\(pid)", &st) == 0 else { return nil }
        return (st.st_uid, start)
    }
}

extension Agent {
    /// Every call starts here, before its object is resolved. The sender's pid is returned as
    /// the claim the broker checks, once the bus has vouched that the sender runs as this
    /// agent's user and that pid still names the process that connected. Anything else is
    /// refused (AccessDenied) and reported to the broker for its audit log: another user's
    /// process learns nothing, not even whether a path exists.
    func confirmedClaim(sender: String, member: String, path: String) throws(BusError) -> Int32 {
        let item: ItemReference? = {
            guard case .item(let id)? = SecretObject.resolve(path), let i = state.items[id] else { return nil }
            return ItemReference(service: i.service, account: i.account)
        }()
        let asked = "\(member) on \(path) from \(sender)"
        guard let creds = credentials(of: sender) else {
            reporter.report(vault, item: item, claimedPID: Request.unreadableClaimedPID, asked: asked, source: "unreadable")
            throw .accessDenied("the bus could not say who sent this call")
        }
        guard creds.uid == getuid() else {
            reporter.report(vault, item: item, claimedPID: creds.pid, asked: asked + " (uid \(creds.uid))", source: "uid \(creds.uid)")
            throw .accessDenied("only this user's own processes may use this Secret Service")
        }
        guard let first = creds.startTime, let now = ProcessIdentity.read(pid: creds.pid),
              now.uid == getuid(), now.startTime == first else {
            reporter.report(vault, item: item, claimedPID: creds.pid, asked: asked + " (the connecting process is gone)",
                            source: "gone")
            throw .accessDenied("the process that connected to the bus is gone")
        }
        return creds.pid
    }

    /// The connection's credentials: cached per unique name (never reused on a bus), else
    /// asked of the bus daemon, one short call. nil when the daemon cannot say (the sender
    /// already left).
    func credentials(of sender: String) -> ClientCredentials? {
        if let known = state.clients[sender] { return known }
        guard sender.hasPrefix(":"), let (uid, pid) = askBus(sender) else { return nil }
        let creds = ClientCredentials(uid: uid, pid: pid, startTime: ProcessIdentity.read(pid: pid)?.startTime)
        if state.clients.count < AgentState.maxClients { state.clients[sender] = creds }
        return creds
    }

    /// `org.freedesktop.DBus.GetConnectionCredentials`: UnixUserID and ProcessID, both needed.
    private func askBus(_ sender: String) -> (UInt32, Int32)? {
        var call: OpaquePointer?
        guard sd_bus_message_new_method_call(bus, &call, "org.freedesktop.DBus", "/org/freedesktop/DBus",
                                             "org.freedesktop.DBus", "GetConnectionCredentials") >= 0, let call else { return nil }
        defer { sd_bus_message_unref(call) }
        guard sd_bus_message_append_basic(call, CChar(UInt8(ascii: "s")), sender) >= 0 else { return nil }
        var reply: OpaquePointer?
        guard sd_bus_call(bus, call, Self.credentialsTimeoutMicroseconds, nil, &reply) >= 0, let reply else { return nil }
        defer { sd_bus_message_unref(reply) }
        let r = MessageReader(m: reply)
        var uid: UInt32?, pid: UInt32?
        do throws(BusError) {
            guard try r.enter(UInt8(ascii: "a"), "{sv}") else { return nil }
            while try r.enter(UInt8(ascii: "e"), "sv") {
                let key = try r.string()
                let sig = try r.enterVariant()
                switch (key, sig) {
                case ("UnixUserID", "u"?): uid = try r.uint32()
                case ("ProcessID", "u"?): pid = try r.uint32()
                case (_, let other?): try r.skip(other)
                case (_, nil): return nil
                }
                try r.exit()
                try r.exit()
            }
        } catch {
            return nil
        }
        guard let uid, let pid, pid > 0, pid <= UInt32(Int32.max) else { return nil }
        return (uid, Int32(pid))
    }

    /// The bus daemon answers from memory; a daemon that does not answer in this long leaves
    /// the call refused rather than the loop waiting.
    static let credentialsTimeoutMicroseconds: UInt64 = 500_000
}

/// Sends the refusal reports to the broker off the event loop (the broker may be busy): queued,
/// and sent by a few threads that drain the queue. Each report costs the *owner's* audit
/// budget, so refusals are reported one by one up to a burst per source (another uid, a gone
/// process, an unreadable sender), then one a second, each saying how many it stands for: a
/// flood from another user cannot spend the owner's budget, nor the loop's time.
final class RefusalReporter: Sendable {
    struct Report: Sendable {
        let item: ItemReference?
        let claimedPID: Int32
        let asked: String
    }

    struct Tally {
        var tokens: Double
        var at: Int64
        var unreported: Int
    }

    static let maxRunning = 4
    static let maxQueued = 256
    static let burst = 64.0
    static let perSecond = 1.0
    static let maxSources = 256
    private let pending = Mutex<(queue: [Report], running: Int, tallies: [String: Tally])>(([], 0, [:]))

    func report(_ vault: Vault, item: ItemReference?, claimedPID: Int32, asked: String, source: String) {
        let now = MonotonicClock.milliseconds()
        let start: Bool = pending.withLock { p in
            let key = p.tallies[source] != nil || p.tallies.count < Self.maxSources ? source : "other"
            var t = p.tallies[key] ?? Tally(tokens: Self.burst, at: now, unreported: 0)
            t.tokens = min(Self.burst, t.tokens + Double(now - t.at) / 1000 * Self.perSecond)
            t.at = now
            guard t.tokens >= 1, p.queue.count < Self.maxQueued else {
                t.unreported += 1
                p.tallies[key] = t
                return false
            }
            t.tokens -= 1
            let text = t.unreported > 0 ? "\(asked), and \(t.unreported) more refused call(s) from \(key) not reported one by one" : asked
            t.unreported = 0
            p.tallies[key] = t
            p.queue.append(Report(item: item, claimedPID: claimedPID, asked: text))
            guard p.running < Self.maxRunning else { return false }
            p.running += 1
            return true
        }
        guard start else { return }
        if !DetachedThread.start({ [self] in drain(vault) }) { pending.withLock { $0.running -= 1 } }
    }

    private func drain(_ vault: Vault) {
        while true {
            let next: Report? = pending.withLock { p in
                guard !p.queue.isEmpty else { p.running -= 1; return nil }
                return p.queue.removeFirst()
            }
            guard let r = next else { return }
            vault.reportRefusal(item: r.item, claimedPID: r.claimedPID, asked: r.asked)
        }
    }
}
