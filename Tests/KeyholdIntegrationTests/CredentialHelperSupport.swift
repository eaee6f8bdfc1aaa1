import Foundation
import Glibc
import KeyholdTestSupport

/// git's smart-HTTP server for the credential helper tests: `git http-backend` as CGI behind a
/// small python server on 127.0.0.1 that demands Basic auth against a password file the test
/// can rewrite (a password change on the server). Started and stopped by the test.
final class GitHTTPServer: @unchecked Sendable {
    let directory: String
    let root: String
    let passwordFile: String
    let requestLog: String
    let port: Int
    private let process: Process

    static let script = #"""
        import base64, http.server, os, subprocess, sys
        root, passwords, port_file, log = sys.argv[1:5]

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args): pass
            def do_GET(self): self.serve()
            def do_POST(self): self.serve()

            def serve(self):
                users = dict(l.split(':', 1) for l in open(passwords).read().split() if ':' in l)
                header, user = self.headers.get('Authorization', ''), None
                if header.startswith('Basic '):
                    try:
                        name, password = base64.b64decode(header[6:]).decode().split(':', 1)
                        user = name if users.get(name) == password else None
                    except Exception:
                        user = None
                with open(log, 'a') as f:
                    f.write('%s %s %s\n' % (self.command, self.path.split('?')[0], user or ('rejected' if header else 'none')))
                body = b''
                if self.headers.get('Transfer-Encoding', '').lower() == 'chunked':
                    while True:
                        size = int(self.rfile.readline().split(b';')[0].strip(), 16)
                        if size == 0:
                            self.rfile.readline(); break
                        body += self.rfile.read(size); self.rfile.readline()
                elif self.headers.get('Content-Length'):
                    body = self.rfile.read(int(self.headers['Content-Length']))
                if user is None:
                    self.send_response(401)
                    self.send_header('WWW-Authenticate', 'Basic realm="keyhold-test"')
                    self.send_header('Content-Length', '0'); self.end_headers(); return
                path, _, query = self.path.partition('?')
                env = dict(os.environ, GIT_PROJECT_ROOT=root, GIT_HTTP_EXPORT_ALL='1', REQUEST_METHOD=self.command,
                           PATH_INFO=path, QUERY_STRING=query, REMOTE_USER=user, REMOTE_ADDR='127.0.0.1',
                           CONTENT_TYPE=self.headers.get('Content-Type', ''), CONTENT_LENGTH=str(len(body)))
                if self.headers.get('Content-Encoding'): env['HTTP_CONTENT_ENCODING'] = self.headers['Content-Encoding']
                if self.headers.get('Git-Protocol'): env['GIT_PROTOCOL'] = self.headers['Git-Protocol']
                out = subprocess.run(['git', 'http-backend'], input=body, env=env, capture_output=True, timeout=60).stdout
                sep = b'\r\n\r\n' if b'\r\n\r\n' in out else b'\n\n'
                head, _, rest = out.partition(sep)
                status, headers = 200, []
                for line in head.decode().splitlines():
                    key, _, value = line.partition(':')
                    if key.lower() == 'status': status = int(value.split()[0])
                    elif key: headers.append((key, value.strip()))
                self.send_response(status)
                for key, value in headers: self.send_header(key, value)
                self.send_header('Content-Length', str(len(rest))); self.end_headers(); self.wfile.write(rest)

        server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
        with open(port_file + '.tmp', 'w') as f: f.write(str(server.server_address[1]))
        os.rename(port_file + '.tmp', port_file)
        server.serve_forever()
        """#

    /// A server whose users are `passwords`; `repository` (a bare repo with one commit) is served
    /// at `/repo.git`.
    init(passwords: [String: String]) throws {
        directory = TestPaths.temporaryDirectory("khgit")
        root = directory + "/srv"
        passwordFile = directory + "/passwords"
        requestLog = directory + "/requests.log"
        mkdir(root, 0o755)
        try Self.seed(root + "/repo.git", scratch: directory + "/seed")
        let scriptPath = directory + "/server.py"
        try Self.script.write(toFile: scriptPath, atomically: true, encoding: .utf8)
        let portFile = directory + "/port"
        process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
        process.arguments = [scriptPath, root, passwordFile, portFile, requestLog]
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        var found: Int?
        try Self.passwordText(passwords).write(toFile: passwordFile, atomically: true, encoding: .utf8)
        try process.run()
        for _ in 0..<500 {
            if let t = try? String(contentsOfFile: portFile, encoding: .utf8), let p = Int(t) { found = p; break }
            usleep(20_000)
        }
        guard let found else { kill(process.processIdentifier, SIGKILL); throw FixtureError.brokerDidNotStart("the git HTTP server did not start") }
        port = found
    }

    static func passwordText(_ passwords: [String: String]) -> String {
        passwords.map { "\($0.key):\($0.value)" }.joined(separator: "\n") + "\n"
    }

    func setPasswords(_ passwords: [String: String]) {
        try? Self.passwordText(passwords).write(toFile: passwordFile, atomically: true, encoding: .utf8)
    }

    func url(user: String) -> String { "http://\(user)@127.0.0.1:\(port)/repo.git" }

    var requests: [String] {
        ((try? String(contentsOfFile: requestLog, encoding: .utf8)) ?? "").split(separator: "\n").map(String.init)
    }

    static func seed(_ bare: String, scratch: String) throws {
        let env = ["HOME": scratch, "GIT_CONFIG_NOSYSTEM": "1"]
        mkdir(scratch, 0o755)
        for args in [["init", "-q", "--bare", bare], ["init", "-q", "-b", "main", scratch + "/w"],
                     ["-C", scratch + "/w", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "seed"],
                     ["-C", scratch + "/w", "push", "-q", bare, "main"],
                     ["-C", bare, "symbolic-ref", "HEAD", "refs/heads/main"]] {
            let r = runCommand("/usr/bin/git", args, environment: env)
            guard r.status == 0 else { throw FixtureError.brokerDidNotStart("git \(args): \(r.stderr)") }
        }
    }

    deinit {
        // SIGKILL: Foundation's Process starts children with SIGTERM blocked.
        if process.isRunning { kill(process.processIdentifier, SIGKILL); process.waitUntilExit() }
        try? FileManager.default.removeItem(atPath: directory)
    }
}

/// A HOME with `credential.helper keyhold` and the helpers on PATH, as a user would set it up.
struct GitClient {
    let broker: BrokerFixture
    let home: String

    init(_ broker: BrokerFixture, helper: String = "keyhold", config: [String] = []) throws {
        self.broker = broker
        home = broker.directory + "/home-\(Int.random(in: 1000...9999))"
        mkdir(home, 0o755)
        var text = "[credential]\n\thelper = \(helper)\n[user]\n\tname = t\n\temail = t@t\n"
        for line in config { text += line + "\n" }
        try text.write(toFile: home + "/.gitconfig", atomically: true, encoding: .utf8)
    }

    /// No askpass and no terminal unless a test gives one.
    func environment(_ extra: [String: String] = [:]) -> [String: String] {
        var env = ["HOME": home, "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "", "SSH_ASKPASS": "",
                   "KEYHOLD_SOCKET": broker.socketPath, "PATH": TestPaths.products + ":/usr/bin:/bin",
                   "KEYHOLD_ASKPASS_TIMEOUT": "20"]
        for (k, v) in extra { env[k] = v }
        return env
    }

    @discardableResult
    func git(_ args: [String], stdin: String = "", environment extra: [String: String] = [:]) -> CommandResult {
        runCommand("/usr/bin/git", args, stdin: Array(stdin.utf8), environment: environment(extra))
    }

    /// `git credential ACTION` with a description.
    func credential(_ action: String, _ lines: [String], environment extra: [String: String] = [:]) -> CommandResult {
        git(["credential", action], stdin: lines.joined(separator: "\n") + "\n\n", environment: extra)
    }

    /// An askpass program that logs each prompt to `log` and answers `answer` (nil: cancels).
    func askpass(_ name: String, answer: String?, log: String) -> String {
        let path = broker.directory + "/" + name
        let reply = answer.map { "printf '%s\\n' '\($0)'" } ?? "exit 1"
        let body = "#!/bin/sh\nprintf '%s\\n' \"$1\" >> '\(log)'\n\(reply)\n"
        _ = FileManager.default.createFile(atPath: path, contents: Data(body.utf8))
        chmod(path, 0o755)
        return path
    }
}

/// Runs a helper binary directly against `broker`, without a terminal. Its input comes from a
/// file: a helper that refuses a huge input early must not break the test's pipe (SIGPIPE).
func helper(_ name: String, _ args: [String], stdin: String, broker: BrokerFixture, environment: [String: String] = [:],
            asUser: String? = nil) -> CommandResult {
    let input = broker.directory + "/helper-input-\(Int.random(in: 0..<1_000_000))"
    _ = FileManager.default.createFile(atPath: input, contents: Data(stdin.utf8), attributes: [.posixPermissions: 0o644])
    defer { unlink(input) }
    var env = ["KEYHOLD_SOCKET": broker.socketPath, "GIT_ASKPASS": "", "KH_IN": input]
    for (k, v) in environment { env[k] = v }
    return runCommand("/bin/sh", ["-c", "exec \"$0\" \"$@\" < \"$KH_IN\"", TestPaths.products + "/" + name] + args,
                      environment: env, asUser: asUser)
}

func lines(_ path: String) -> [String] {
    ((try? String(contentsOfFile: path, encoding: .utf8)) ?? "").split(separator: "\n").map(String.init)
}
