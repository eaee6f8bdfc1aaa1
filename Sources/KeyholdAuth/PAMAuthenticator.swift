import Glibc
import KeyholdCore

/// Runs PAM transactions for the broker, each in its own short-lived helper process
/// (`<helperExecutable> --pam-helper`), so a module that hangs, crashes or ignores the
/// conversation can be killed without touching the broker or other callers.
///
/// `authenticate` blocks the calling thread (the broker's per-connection thread) until the
/// transaction ends. The helper is always killed (SIGKILL to its process group, which also
/// ends programs its modules started) and reaped before the call returns.
public final class PAMAuthenticator: Sendable {
    public let helperExecutable: String
    /// Directory of PAM service files for `pam_start_confdir`; nil = the system's `/etc/pam.d`.
    public let serviceDirectory: String?
    public let deadlineSeconds: Int
    /// Upper bound on messages one transaction may send; more is a misbehaving module.
    static let maxMessages = 256

    public init(helperExecutable: String, serviceDirectory: String?, deadlineSeconds: Int = 120) {
        self.helperExecutable = helperExecutable
        self.serviceDirectory = serviceDirectory
        self.deadlineSeconds = max(1, deadlineSeconds)
    }

    /// Authenticates `request.user` through `request.service`.
    /// - allowInteraction: when false, the first prompt ends the transaction with
    ///   `.interactionNeeded` before anyone answers it; info and error messages are relayed.
    /// - interruptFD: when it becomes readable (or hangs up, or is invalid), the helper is killed
    ///   → `.canceled`. It is polled while the helper runs and checked just before and after each
    ///   `conversation` call; *during* that call the conversation itself must notice the caller
    ///   going away and return `.cancel`.
    /// - conversation: called on this thread for each message, in order. For info and error
    ///   messages the answer is ignored but `.cancel` still ends the transaction.
    ///
    /// The deadline covers the whole transaction, time spent at prompts included. Requirement on
    /// the broker process: SIGCHLD must not be ignored (SA_NOCLDWAIT), and nothing else may
    /// `waitpid(-1)`, or helpers would be reaped behind this call's back.
    public func authenticate(_ request: PAMRequest, allowInteraction: Bool, interruptFD: Int32?,
                             conversation: (PAMMessage) -> PAMAnswer) -> PAMResult {
        guard PAMRequestRules.validService(request.service) else { return .unavailable(code: PAMCode.serviceError) }
        for field in [request.user, request.ruser, request.tty, request.rhost, serviceDirectory] {
            if let f = field, !PAMRequestRules.validField(f) { return .unavailable(code: PAMCode.badItem) }
        }
        let deadline = MonotonicClock.nanoseconds() + UInt64(deadlineSeconds) * 1_000_000_000
        guard let helper = PAMHelperHandle.spawn(executable: helperExecutable) else { return .helperFailed }
        // After a result the helper has run pam_end and is exiting; any other end may leave
        // programs its modules started in their own sessions (pam_exec calls setsid).
        var ended = false
        defer { helper.killAndReap(descendants: !ended) }

        let wire = PAMWireRequest(request: request, serviceDirectory: serviceDirectory,
                                  deadlineSeconds: UInt32(deadlineSeconds))
        guard PAMIO.sendFrame(helper.channel, .request, wire.encode(), deadline: deadline) else { return .helperFailed }

        var reader = PAMFrameReader()
        var answeredPrompt = false
        var messages = 0
        while true {
            // Wait for the helper, the interrupt fd, or the deadline.
            let now = MonotonicClock.nanoseconds()
            guard now < deadline else { return .helperFailed }
            let waitMs = Int32(clamping: (deadline - now + 999_999) / 1_000_000)
            var fds = [pollfd(fd: helper.channel, events: Int16(POLLIN), revents: 0)]
            if let i = interruptFD { fds.append(pollfd(fd: i, events: Int16(POLLIN), revents: 0)) }
            let r = poll(&fds, nfds_t(fds.count), waitMs)
            if r < 0 {
                if errno == EINTR { continue }
                return .helperFailed
            }
            if fds.count > 1 && fds[1].revents != 0 { return .canceled }
            if fds[0].revents == 0 { continue }

            switch reader.fill(from: helper.channel) {
            case .broken: return .helperFailed
            case .progress: break
            }
            while let frame = reader.next() {
                guard let frame = frame else { return .helperFailed }  // garbled
                switch frame {
                case .done(let stage, let code):
                    ended = true
                    return Self.result(stage: stage, code: code, answeredPrompt: answeredPrompt)
                case .message(let message):
                    messages += 1
                    guard messages <= Self.maxMessages else { return .helperFailed }
                    if message.isPrompt && !allowInteraction { return .interactionNeeded }
                    if let i = interruptFD, Self.fired(i) { return .canceled }
                    let reply = conversation(message)
                    if let i = interruptFD, Self.fired(i) { return .canceled }
                    guard MonotonicClock.nanoseconds() < deadline else { return .helperFailed }
                    switch reply {
                    case .cancel:
                        return .canceled
                    case .answer(let secret):
                        guard message.isPrompt else { continue }  // no answer wanted
                        guard secret.count <= PAMRequestRules.maxConversationAnswerBytes else { return .canceled }
                        let header = PAMFrame.header(.answer, secret.count)
                        let sent = header.withUnsafeBytes { PAMIO.sendAll(helper.channel, $0, deadline: deadline) }
                            && secret.withUnsafeBytes { PAMIO.sendAll(helper.channel, $0, deadline: deadline) }
                        guard sent else { return .helperFailed }
                        answeredPrompt = true
                    }
                }
            }
            if reader.sawEOF { return .helperFailed }  // exited without a result: crashed
        }
    }

    static func fired(_ fd: Int32) -> Bool {
        var p = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        return poll(&p, 1, 0) > 0 && p.revents != 0
    }

    static func result(stage: UInt8, code: Int32, answeredPrompt: Bool) -> PAMResult {
        switch stage {
        case PAMFrame.stageSuccess where code == PAMCode.success:
            return .success(answeredPrompt: answeredPrompt)
        case PAMFrame.stageStart where code != PAMCode.success:
            return .unavailable(code: code)
        case PAMFrame.stageAuthenticate where code != PAMCode.success, PAMFrame.stageAccount where code != PAMCode.success:
            return PAMResult.classify(code)
        default:
            return .helperFailed  // inconsistent stage/code: a broken helper
        }
    }
}

/// Frames from the helper, parsed strictly from a bounded buffer filled without blocking.
struct PAMFrameReader {
    /// Module text is shown on the caller's terminal: invalid UTF-8 becomes U+FFFD and what
    /// `Printable` would escape, other than tab and newline (escape sequences), is dropped.
    static func displayable(_ bytes: ArraySlice<UInt8>) -> String {
        var scalars = String.UnicodeScalarView()
        for u in String(decoding: bytes, as: UTF8.self).unicodeScalars {
            if u == "\t" || u == "\n" || !Printable.needsEscape(u) { scalars.append(u) }
        }
        return String(scalars)
    }

    enum Frame { case message(PAMMessage), done(stage: UInt8, code: Int32) }
    enum Fill { case progress, broken }
    private var buffer: [UInt8] = []
    private(set) var sawEOF = false

    /// One read per wake-up: complete frames are handled before more is read, so the buffer
    /// never holds more than one partial frame plus one chunk, whatever the helper writes.
    mutating func fill(from fd: Int32) -> Fill {
        var chunk = [UInt8](repeating: 0, count: 4096)
        while true {
            let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress!, $0.count) }
            if n > 0 {
                buffer += chunk[0..<n]
                if buffer.count > PAMFrame.headerBytes + PAMFrameKind.message.maxPayload + chunk.count { return .broken }
                return .progress
            }
            if n == 0 { sawEOF = true; return .progress }
            if errno == EINTR { continue }
            if errno == EAGAIN || errno == EWOULDBLOCK { return .progress }
            sawEOF = true
            return .progress
        }
    }

    /// nil: need more bytes. .some(nil): garbled. .some(frame): one frame.
    mutating func next() -> Frame?? {
        guard buffer.count >= PAMFrame.headerBytes else { return nil }
        guard let (kind, n) = PAMFrame.parseHeader(buffer[0..<PAMFrame.headerBytes]) else { return .some(nil) }
        guard buffer.count >= PAMFrame.headerBytes + n else { return nil }
        let payload = Array(buffer[PAMFrame.headerBytes..<PAMFrame.headerBytes + n])
        buffer.removeFirst(PAMFrame.headerBytes + n)
        switch kind {
        case .message:
            guard let style = payload.first else { return .some(nil) }
            let text = Self.displayable(payload.dropFirst())
            switch style {
            case PAMFrame.styleEchoOff: return .message(.promptEchoOff(text))
            case PAMFrame.styleEchoOn: return .message(.promptEchoOn(text))
            case PAMFrame.styleError: return .message(.error(text))
            case PAMFrame.styleInfo: return .message(.info(text))
            default: return .some(nil)
            }
        case .done:
            guard payload.count == 5, payload[0] <= PAMFrame.stageSuccess else { return .some(nil) }
            let u = UInt32(payload[1]) << 24 | UInt32(payload[2]) << 16 | UInt32(payload[3]) << 8 | UInt32(payload[4])
            return .done(stage: payload[0], code: Int32(bitPattern: u))
        case .request, .answer, .cancel:
            return .some(nil)  // the helper never sends these
        }
    }
}

/// One spawned helper: its pid (also its process group) and the broker's end of the channel.
final class PAMHelperHandle {
    let pid: pid_t
    let channel: Int32
    private var reaped = false

    private init(pid: pid_t, channel: Int32) {
        self.pid = pid
        self.channel = channel
    }

    /// posix_spawn with the child's end of a socketpair as fd 3, /dev/null as stdin/stdout,
    /// default signal dispositions, an empty signal mask, its own process group, and every other
    /// fd closed (closefrom where glibc has it; the broker's fds are CLOEXEC anyway).
    static func spawn(executable: String) -> PAMHelperHandle? {
        var pair: [Int32] = [-1, -1]
        guard socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &pair) == 0 else { return nil }
        var childEnd = pair[1]
        let brokerEnd = pair[0]
        if childEnd == PAMFrame.helperChannel {
            // dup2(3, 3) would leave CLOEXEC set: move it out of the way first.
            let moved = fcntl(childEnd, F_DUPFD_CLOEXEC, 10)
            close(childEnd)
            guard moved >= 0 else { close(brokerEnd); return nil }
            childEnd = moved
        }
        defer { close(childEnd) }
        guard fcntl(brokerEnd, F_SETFL, fcntl(brokerEnd, F_GETFL) | O_NONBLOCK) == 0 else { close(brokerEnd); return nil }

        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
        posix_spawn_file_actions_adddup2(&actions, childEnd, PAMFrame.helperChannel)
        if let closeFrom = closeFromAction { _ = closeFrom(&actions, PAMFrame.helperChannel + 1) }

        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var mask = sigset_t()
        sigemptyset(&mask)
        posix_spawnattr_setsigmask(&attributes, &mask)
        var defaults = sigset_t()
        sigemptyset(&defaults)
        for s: Int32 in 1..<32 where s != SIGKILL && s != SIGSTOP { sigaddset(&defaults, s) }
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        posix_spawnattr_setpgroup(&attributes, 0)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP))

        let argv: [UnsafeMutablePointer<CChar>?] = [strdup(executable), strdup("--pam-helper"), strdup(String(getpid())), nil]
        defer { for a in argv { free(a) } }
        var pid: pid_t = 0
        let rc = posix_spawn(&pid, executable, &actions, &attributes, argv, environ)
        guard rc == 0 else { close(brokerEnd); return nil }
        return PAMHelperHandle(pid: pid, channel: brokerEnd)
    }

    /// SIGKILL to the helper's process group, and with `descendants` to every process below it
    /// (stopped first, so none can fork past the scan; pam_exec children run in their own
    /// session and would escape a group kill). Then reap the helper.
    func killAndReap(descendants: Bool = true) {
        guard !reaped else { return }
        reaped = true
        if descendants {
            kill(pid, SIGSTOP)
            var tree: Set<Int32> = [pid]
            var grew = true
            var rounds = 0
            while grew && rounds < 16 {
                grew = false
                rounds += 1
                for p in ProcFile.pids() where !tree.contains(p) {
                    if let s = ProcStat.read(pid: p), tree.contains(s.ppid) {
                        kill(p, SIGSTOP)
                        tree.insert(p)
                        grew = true
                    }
                }
            }
            for p in tree where p != pid { kill(p, SIGKILL) }
        }
        kill(-pid, SIGKILL)
        kill(pid, SIGKILL)
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
        close(channel)
    }

    deinit { killAndReap(descendants: true) }

    typealias CloseFrom = @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>?, Int32) -> Int32
    /// glibc ≥ 2.34 has posix_spawn_file_actions_addclosefrom_np, declared only under _GNU_SOURCE.
    static let closeFromAction: CloseFrom? = {
        guard let sym = dlsym(nil, "posix_spawn_file_actions_addclosefrom_np") else { return nil }
        return unsafeBitCast(sym, to: CloseFrom.self)
    }()
}
