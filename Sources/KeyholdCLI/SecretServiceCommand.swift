import Glibc

/// `keyhold [--socket PATH] secret-service [OPTIONS]` runs the Secret Service agent: it execs
/// `keyhold-secret-service` from the same directory as `keyhold` (the agent links sd-bus and
/// libcrypto; the CLI does not), passing the socket on.
public enum SecretServiceCommand {
    /// nil when the command is not `secret-service`; else the status of a failed exec.
    public static func run(_ arguments: [String]) -> Int32? {
        var args = arguments
        var socket: [String] = []
        if args.count >= 2, args[0] == "--socket" {
            socket = ["--socket", args[1]]
            args.removeFirst(2)
        }
        guard args.first == "secret-service" else { return nil }
        var buf = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        let n = readlink("/proc/self/exe", &buf, buf.count - 1)
        guard n > 0 else {
            Output.err("cannot find keyhold-secret-service")
            return 1
        }
        let me = String(decoding: buf[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
        let dir = me.split(separator: "/", omittingEmptySubsequences: false).dropLast().joined(separator: "/")
        let agent = dir + "/keyhold-secret-service"
        let argv = [agent] + socket + Array(args.dropFirst())
        var cargs: [UnsafeMutablePointer<CChar>?] = argv.map { strdup($0) }
        cargs.append(nil)
        execv(agent, &cargs)
        Output.err("cannot run \(agent): \(String(cString: strerror(errno)))")
        return 1
    }
}
