import Glibc

/// Runs a program as its own process with posix_spawn and waits for it (Foundation's Process
/// adds tens of ms of its own per launch on Linux, which would swamp what is measured here).
/// stdout and stderr go to /dev/null; `stdin` is written to the child's standard input.
func run(_ path: String, _ arguments: [String], stdin: [UInt8] = [], environment: [String]? = nil) -> Int32 {
    var fds: [Int32] = [0, 0]
    precondition(pipe(&fds) == 0)
    for fd in fds { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
    let devnull = open("/dev/null", O_WRONLY | O_CLOEXEC)
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    posix_spawn_file_actions_adddup2(&actions, fds[0], 0)
    posix_spawn_file_actions_adddup2(&actions, devnull, 1)
    posix_spawn_file_actions_adddup2(&actions, devnull, 2)
    let argv = ([path] + arguments).map { strdup($0) } + [nil]
    let envp = environment.map { $0.map { strdup($0) } + [nil] }
    var pid: pid_t = 0
    let rc = envp.map { e in posix_spawn(&pid, path, &actions, nil, argv, e) } ?? posix_spawn(&pid, path, &actions, nil, argv, environ)
    posix_spawn_file_actions_destroy(&actions)
    argv.forEach { free($0) }
    envp?.forEach { free($0) }
    close(fds[0]); close(devnull)
    precondition(rc == 0, "cannot spawn \(path)")
    if !stdin.isEmpty { _ = stdin.withUnsafeBytes { write(fds[1], $0.baseAddress, $0.count) } }
    close(fds[1])
    var status: Int32 = 0
    while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
    return status
}

/// Starts a program in the background (a daemon the benchmark stops itself), its standard
/// streams on /dev/null; its pid, or nil when it cannot be started.
func spawnDaemon(_ path: String, _ arguments: [String], environment: [String]) -> pid_t? {
    let devnull = open("/dev/null", O_RDWR | O_CLOEXEC)
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    for fd: Int32 in 0...2 { posix_spawn_file_actions_adddup2(&actions, devnull, fd) }
    let argv = ([path] + arguments).map { strdup($0) } + [nil]
    let envp = environment.map { strdup($0) } + [nil]
    var pid: pid_t = 0
    let rc = posix_spawn(&pid, path, &actions, nil, argv, envp)
    posix_spawn_file_actions_destroy(&actions)
    argv.forEach { free($0) }
    envp.forEach { free($0) }
    close(devnull)
    return rc == 0 ? pid : nil
}

/// Wall-clock seconds of `samples` runs of one command, each a fresh process.
func spawnTimes(_ samples: Int, _ path: String, _ arguments: () -> [String], environment: [String]? = nil) -> [Double] {
    var times: [Double] = []
    times.reserveCapacity(samples)
    for _ in 0..<samples {
        let args = arguments()
        let t0 = now()
        _ = run(path, args, environment: environment)
        times.append(now() - t0)
    }
    return times
}

/// The first `command -v`-style hit for `name` on a fixed system PATH, or nil.
func installed(_ name: String) -> String? {
    for dir in ["/usr/local/bin", "/usr/bin", "/bin"] where access(dir + "/" + name, X_OK) == 0 { return dir + "/" + name }
    return nil
}

/// The shared objects a process has mapped, from /proc/<pid>/maps, by file name.
func mappedLibraries(_ pid: Int32) -> [String] {
    guard let f = fopen("/proc/\(pid)/maps", "r") else { return [] }
    defer { fclose(f) }
    var names = Set<String>()
    var line = [CChar](repeating: 0, count: 4096)
    while fgets(&line, Int32(line.count), f) != nil {
        let text = String(decoding: line.prefix { $0 != 0 && $0 != 10 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        guard let slash = text.firstIndex(of: "/") else { continue }
        let path = String(text[slash...])
        if path.contains(".so") { names.insert(String(path.split(separator: "/").last!)) }
    }
    return names.sorted()
}
