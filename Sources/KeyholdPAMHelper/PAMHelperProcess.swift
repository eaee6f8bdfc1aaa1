import CKeyholdOS
import CPAM
import Glibc
import KeyholdPAMWire
import KeyholdCore

/// The short-lived process that runs exactly one PAM transaction (`keyhold-pam-helper
/// --pam-helper BROKER-PID`, its own executable beside keyholdd).
///
/// Why a process: PAM modules are third-party code that may block (pam_fprintd waits for a
/// finger and ignores the conversation's return), crash, or leak. The broker spawns one helper
/// per transaction and can SIGKILL it at any moment; nothing a module does can hold up or take
/// down the broker. The helper talks only over the inherited socketpair on fd 3.
public enum PAMHelperProcess {
    static let channel = PAMFrame.helperChannel

    public static func main() -> Never {
        // Die with the broker (PR_SET_PDEATHSIG), and catch the race where it already died.
        _ = ckh_set_parent_death_kill()
        let args = CommandLine.arguments
        if args.count >= 3, let parent = Int32(args[2]), getppid() != parent { _exit(70) }

        // Prompt answers pass through this process: no core dumps, no ptrace by the same uid.
        var noCore = rlimit(rlim_cur: 0, rlim_max: 0)
        _ = setrlimit(__rlimit_resource_t(RLIMIT_CORE.rawValue), &noCore)
        _ = ckh_set_dumpable(0)
        // pam_fprintd watches for a blocked SIGINT (signalfd) as its cancel; a write to a dead
        // broker must be an error, not a signal.
        _ = ckh_block_sigint(1)
        signal(SIGPIPE, SIG_IGN)

        // Programs a module runs (pam_exec, unix_chkpwd) must not inherit the channel.
        guard fcntl(channel, F_SETFD, FD_CLOEXEC) == 0 else { _exit(71) }
        closeOtherDescriptors()

        guard let wire = readRequest() else { _exit(72) }
        // Backstop for a broker that stopped watching: the broker's deadline comes first.
        if wire.deadlineSeconds > 0 { alarm(wire.deadlineSeconds + 5) }

        let (stage, rc) = runTransaction(wire)
        var payload: [UInt8] = [stage]
        let u = UInt32(bitPattern: rc)
        payload += [UInt8(u >> 24), UInt8((u >> 16) & 0xFF), UInt8((u >> 8) & 0xFF), UInt8(u & 0xFF)]
        _ = PAMIO.sendFrame(channel, .done, payload)
        _exit(0)
    }

    /// fds other than 0, 1, 2 and the channel: the broker spawns with closefrom where glibc
    /// has it, this covers the rest.
    private static func closeOtherDescriptors() {
        guard let dir = opendir("/proc/self/fd") else { return }
        let own = dirfd(dir)
        var toClose: [Int32] = []
        while let e = readdir(dir) {
            let name = withUnsafeBytes(of: e.pointee.d_name) { raw in
                String(decoding: raw.prefix(while: { $0 != 0 }), as: UTF8.self)
            }
            if let fd = Int32(name), fd > channel, fd != own { toClose.append(fd) }
        }
        closedir(dir)
        for fd in toClose { close(fd) }
    }

    private static func readRequest() -> PAMWireRequest? {
        var header = [UInt8](repeating: 0, count: PAMFrame.headerBytes)
        guard header.withUnsafeMutableBytes({ PAMIO.readExact(channel, $0.baseAddress!, PAMFrame.headerBytes) }),
              let (kind, n) = PAMFrame.parseHeader(header[...]), kind == .request else { return nil }
        var payload = [UInt8](repeating: 0, count: n)
        if n > 0 {
            guard payload.withUnsafeMutableBytes({ PAMIO.readExact(channel, $0.baseAddress!, n) }) else { return nil }
        }
        return PAMWireRequest.decode(payload)
    }

    /// pam_start[_confdir] → items → pam_authenticate → pam_acct_mgmt, pam_end on every path.
    /// Returns the stage that ended it and its code.
    private static func runTransaction(_ wire: PAMWireRequest) -> (UInt8, Int32) {
        let relay = HelperConversation(channel: channel)
        let context = Unmanaged.passRetained(relay)
        defer { context.release() }
        var conv = pam_conv(conv: helperConversation, appdata_ptr: context.toOpaque())
        var handle: OpaquePointer? = nil
        let r = wire.request
        var rc: Int32
        if let dir = wire.serviceDirectory {
            rc = pam_start_confdir(r.service, r.user, &conv, dir, &handle)
        } else {
            rc = pam_start(r.service, r.user, &conv, &handle)
        }
        guard rc == PAM_SUCCESS, let h = handle else {
            if let h = handle { pam_end(h, rc) }
            return (PAMFrame.stageStart, rc == PAM_SUCCESS ? PAM_SYSTEM_ERR : rc)
        }
        for (item, value) in [(PAM_RUSER, r.ruser), (PAM_TTY, r.tty), (PAM_RHOST, r.rhost)] {
            guard let value else { continue }
            rc = value.withCString { pam_set_item(h, item, $0) }
            if rc != PAM_SUCCESS { pam_end(h, rc); return (PAMFrame.stageStart, rc) }
        }
        rc = pam_authenticate(h, 0)
        if rc != PAM_SUCCESS { pam_end(h, rc); return (PAMFrame.stageAuthenticate, rc) }
        rc = pam_acct_mgmt(h, 0)
        if rc != PAM_SUCCESS { pam_end(h, rc); return (PAMFrame.stageAccount, rc) }
        pam_end(h, PAM_SUCCESS)
        return (PAMFrame.stageSuccess, PAM_SUCCESS)
    }
}

/// State of the helper's conversation: the channel to the broker, and whether the broker went
/// away or canceled (then every later call fails at once).
final class HelperConversation {
    let channel: Int32
    var finished = false
    init(channel: Int32) { self.channel = channel }

    /// Relays one message; for prompts, waits for the answer. Returns malloc'ed C string for an
    /// answer (PAM frees it), nil for no answer; `ok == false` ends the conversation.
    func relay(style: Int32, text: UnsafePointer<CChar>?) -> (ok: Bool, answer: UnsafeMutablePointer<CChar>?) {
        guard !finished else { return (false, nil) }
        let wireStyle: UInt8
        switch style {
        case PAM_PROMPT_ECHO_OFF: wireStyle = PAMFrame.styleEchoOff
        case PAM_PROMPT_ECHO_ON: wireStyle = PAMFrame.styleEchoOn
        case PAM_ERROR_MSG: wireStyle = PAMFrame.styleError
        case PAM_TEXT_INFO: wireStyle = PAMFrame.styleInfo
        default: return (false, nil)  // PAM_BINARY_PROMPT and others: not relayed
        }
        var payload: [UInt8] = [wireStyle]
        if let text {
            let n = strnlen(text, PAMRequestRules.maxMessageBytes)
            text.withMemoryRebound(to: UInt8.self, capacity: n) { payload += UnsafeBufferPointer(start: $0, count: n) }
        }
        guard PAMIO.sendFrame(channel, .message, payload) else { finished = true; return (false, nil) }
        guard wireStyle == PAMFrame.styleEchoOff || wireStyle == PAMFrame.styleEchoOn else { return (true, nil) }
        return readAnswer()
    }

    private func readAnswer() -> (ok: Bool, answer: UnsafeMutablePointer<CChar>?) {
        var header = [UInt8](repeating: 0, count: PAMFrame.headerBytes)
        guard header.withUnsafeMutableBytes({ PAMIO.readExact(channel, $0.baseAddress!, PAMFrame.headerBytes) }),
              let (kind, n) = PAMFrame.parseHeader(header[...]), kind == .answer else {
            finished = true  // cancel, EOF or garbage: no more conversation
            return (false, nil)
        }
        // The answer goes straight from the socket into guarded memory, then into the malloc'ed
        // copy libpam owns (and frees); the guarded copy is wiped on release.
        let secret = SecureBytes(count: n)
        let read = secret.withUnsafeMutableBytes { n == 0 || PAMIO.readExact(channel, $0.baseAddress!, n) }
        guard read else { finished = true; return (false, nil) }
        let hasNUL = secret.withUnsafeBytes { $0.contains(0) }
        guard !hasNUL, let out = malloc(n + 1) else { return (false, nil) }
        secret.withUnsafeBytes { if n > 0 { out.copyMemory(from: $0.baseAddress!, byteCount: n) } }
        out.storeBytes(of: 0, toByteOffset: n, as: UInt8.self)
        secret.wipe()
        return (true, out.assumingMemoryBound(to: CChar.self))
    }
}

/// The C conversation function. Context arrives through appdata_ptr. `resp` may be NULL:
/// pam_matrix (and others) pass NULL for messages that want no answer.
let helperConversation: @convention(c) (
    Int32,
    UnsafeMutablePointer<UnsafePointer<pam_message>?>?,
    UnsafeMutablePointer<UnsafeMutablePointer<pam_response>?>?,
    UnsafeMutableRawPointer?
) -> Int32 = { count, messages, resp, appdata in
    guard let messages, let appdata, count > 0, count <= 32 /* PAM_MAX_NUM_MSG */ else { return PAM_CONV_ERR }
    let relay = Unmanaged<HelperConversation>.fromOpaque(appdata).takeUnretainedValue()
    let n = Int(count)

    guard let resp else {
        // No reply array: only messages may be relayed; a prompt cannot be answered.
        for i in 0..<n {
            guard let m = messages[i] else { return PAM_CONV_ERR }
            let style = m.pointee.msg_style
            if style == PAM_PROMPT_ECHO_OFF || style == PAM_PROMPT_ECHO_ON { return PAM_CONV_ERR }
            guard relay.relay(style: style, text: m.pointee.msg).ok else { return PAM_CONV_ERR }
        }
        return PAM_SUCCESS
    }
    resp.pointee = nil
    guard let raw = calloc(n, MemoryLayout<pam_response>.stride) else { return PAM_BUF_ERR }
    let replies = raw.bindMemory(to: pam_response.self, capacity: n)
    func discard() {
        for i in 0..<n {
            if let r = replies[i].resp { explicit_bzero(r, strlen(r)); free(r) }
        }
        free(raw)
    }
    for i in 0..<n {
        guard let m = messages[i] else { discard(); return PAM_CONV_ERR }  // Linux-PAM: array of pointers
        let (ok, answer) = relay.relay(style: m.pointee.msg_style, text: m.pointee.msg)
        guard ok else { discard(); return PAM_CONV_ERR }
        replies[i].resp = answer
        replies[i].resp_retcode = 0
    }
    resp.pointee = replies
    return PAM_SUCCESS
}
