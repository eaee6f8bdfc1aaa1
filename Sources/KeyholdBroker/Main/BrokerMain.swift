import Glibc
import Synchronization
import CKeyholdOS
import KeyholdAuth
import KeyholdCore
import KeyholdVault

/// `keyholdd`'s start-up: harden the process, open the vault, listen, serve until SIGTERM.
public enum BrokerMain {
    public static func run(arguments: [String]) -> Never {
        reexecWithoutBacktracer()
        let options: BrokerOptions
        do throws(BrokerOptions.ParseError) {
            options = try BrokerOptions(parsing: arguments)
        } catch {
            switch error {
            case .help:
                print(BrokerOptions.usage)
                exit(0)
            case .bad(let why):
                fail("\(why)\n\(BrokerOptions.usage)", code: 2)
            }
        }
        harden()
        // The broker's own path names it in its audit entries; the PAM helper lies beside it.
        guard let helper = CallerFacts.read(pid: getpid())?.executable, helper.hasPrefix("/") else {
            fail("cannot resolve /proc/self/exe")
        }
        let pamHelper = String(helper[..<helper.lastIndex(of: "/")!]) + "/keyhold-pam-helper"
        if let why = Self.unsafeToRun(pamHelper) { fail("\(pamHelper): \(why)") }
        if let target = options.migrateKeyProtector {
            do throws(StoreError) {
                print(try KeyProtectorMigration.run(to: target, options: options, executable: helper))
                exit(0)
            } catch {
                fail("cannot migrate the key protector of \(options.stateDirectory): \(error)", code: Int32(error.outcome.rawValue))
            }
        }
        if options.createRecoveryKey {
            do throws(StoreError) {
                KeyProtectorStart.note(try RecoveryKeySetup.run(options: options, executable: helper))
                exit(0)
            } catch {
                fail("cannot create a recovery key for \(options.stateDirectory): \(error)", code: Int32(error.outcome.rawValue))
            }
        }
        if let file = options.restoreFile {
            do throws(VaultRestore.Failure) {
                print(try VaultRestore.run(file: file, options: options, executable: helper))
                exit(0)
            } catch { fail("cannot restore \(file): \(error.text)", code: error.code) }
        }

        let store: VaultStore
        let protector: KeyProtectorKind
        let access: TPMAccess
        let vault: KeyProtectorSetup.OpenedVault
        do throws(StoreError) {
            access = try TPMAccess.load(options)
            vault = try KeyProtectorSetup.openVault(options, access)
            (store, protector) = (vault.store, vault.kind)
        } catch {
            // The exit status is the reason's outcome, as for the CLI: a key the TPM will not
            // unseal here (another TPM, a cleared one, changed PCRs) or a database swapped while
            // it was opened is integrity (13).
            fail("cannot open the vault in \(options.stateDirectory): \(error)", code: Int32(error.outcome.rawValue))
        }
        // The rollback checks see the head as it was found: an entry written first would move a
        // copy one entry behind its anchor up to it, and the restore would pass.
        let boundPCRs = KeyProtectorSetup.boundPCRs(protector, options)
        var startEntries: [AuditRecord] = []  // copied to the system log once the broker exists
        let anchor = options.rollbackAnchor.map(RollbackAnchor.init(path:))
        if let anchor, let accepted = RollbackAnchorStart.check(anchor, store, options, executable: helper) { startEntries.append(accepted) }
        let (counter, accepted) = KeyProtectorStart.check(vault, options, access, executable: helper)
        if let accepted { startEntries.append(accepted) }
        do throws(StoreError) {
            let start = KeyProtectorSetup.startAudit(protector, bound: boundPCRs, executable: helper)
            try store.append(start)
            startEntries.append(start)
        } catch {
            fail("cannot audit the start in \(options.stateDirectory): \(error)", code: Int32(Outcome.auditUnavailable.rawValue))
        }
        let authenticator = PAMAuthenticator(helperExecutable: pamHelper, serviceDirectory: options.pamDirectory)
        let broker = Broker(store: store, gate: ReleaseGate(authenticator: authenticator, fprintStateDirectory: options.fprintStateDirectory),
                            syslog: AuditSyslog(socketPath: options.syslogSocket),
                            reserve: FreeSpaceReserve(directory: options.stateDirectory, bytes: options.freeSpaceReserve),
                            protection: VaultProtection(keyProtector: protector, anchored: anchor != nil, recovery: store.recoveryState()),
                            anchor: anchor, counter: counter)
        for entry in startEntries { broker.syslog.record(entry) }

        // Before the socket listens: whoever can connect can also read how the key is kept.
        broker.log(KeyProtectorSetup.startLine(protector, options, bound: boundPCRs))
        broker.log(RecoveryKeySetup.startLine(broker.protection.recovery))
        // Whether `--allow-exe` can tell the process that connected from one that took its pid.
        broker.log(ckh_kernel_has_peer_pidfd() == 1 ? "callers: each connection names its process (SO_PEERPIDFD)"
                   : "callers: no SO_PEERPIDFD on this kernel; --allow-exe checks the connecting process by pid number, "
                     + "which a process that exits before it is accepted can leave to another (SECURITY.md, \"PID reuse\")")
        let listener: Int32
        do throws(ListenerError) {
            listener = try Listener.bind(path: options.socketPath, mode: options.socketMode)
        } catch {
            fail("cannot listen on \(options.socketPath): \(error)")
        }
        startSignalThread(broker: broker, listener: listener, socketPath: options.socketPath)
        // Counted refusals become refused-burst entries once each uid's audit budget refills.
        DetachedThread.start {
            while true {
                sleep(1)
                broker.flushRefusedBursts()
            }
        }
        broker.log("serving \(options.socketPath) from \(options.stateDirectory)")
        Listener.serve(listener, broker: broker)
    }

    /// The Swift runtime's crash backtracer prints registers, which may point at secret bytes.
    /// It reads its setting at process start, so set it and start again.
    static func reexecWithoutBacktracer() {
        if let v = getenv("SWIFT_BACKTRACE"), String(cString: v) == "enable=no" { return }
        setenv("SWIFT_BACKTRACE", "enable=no", 1)
        var argv: [UnsafeMutablePointer<CChar>?] = CommandLine.arguments.map { strdup($0) }
        argv.append(nil)
        execv("/proc/self/exe", argv)
        fail("cannot re-execute with the crash backtracer disabled (errno \(errno))")
    }

    /// No core dumps, no ptrace by same-uid processes, private files by default.
    static func harden() {
        var rl = rlimit(rlim_cur: 0, rlim_max: 0)
        guard setrlimit(__rlimit_resource_t(RLIMIT_CORE.rawValue), &rl) == 0, ckh_set_dumpable(0) == 0 else {
            fail("cannot disable core dumps")
        }
        umask(0o077)
        // A descriptor per connection (and a pidfd): the slots of `ConnectionSlots` plus room.
        _ = ckh_raise_nofile(8192)
        signal(SIGPIPE, SIG_IGN)
        // A write past RLIMIT_FSIZE must fail the transaction (→ audit unavailable), not kill us.
        signal(SIGXFSZ, SIG_IGN)
        // SIGTERM/SIGINT/SIGHUP are taken by one thread with sigwait; block them everywhere first.
        var set = sigset_t()
        sigemptyset(&set)
        for s in [SIGTERM, SIGINT, SIGHUP] { sigaddset(&set, s) }
        pthread_sigmask(SIG_BLOCK, &set, nil)
    }

    static func startSignalThread(broker: Broker, listener: Int32, socketPath: String) {
        DetachedThread.start {
            var set = sigset_t()
            sigemptyset(&set)
            for s in [SIGTERM, SIGINT, SIGHUP] { sigaddset(&set, s) }
            var sig: Int32 = 0
            while sigwait(&set, &sig) == 0 {
                if sig == SIGHUP { continue }
                broker.log("signal \(sig): shutting down")
                unlink(socketPath)
                shutdown(listener, Int32(SHUT_RDWR))
                // Waits for the store call in flight, checkpoints, and never gives the lock back.
                broker.closeAndExit()
            }
        }
    }

    /// Why the broker must not execute `path` as root, or nil: it runs with the broker's
    /// privileges, so it must be a regular file owned by root (or the broker's user), that no
    /// one else can write, in a directory no one else can write.
    static func unsafeToRun(_ path: String) -> String? {
        var st = stat()
        guard lstat(path, &st) == 0 else { return "missing: keyhold-pam-helper must be installed beside keyholdd" }
        guard (st.st_mode & S_IFMT) == S_IFREG, st.st_mode & S_IXUSR != 0 else { return "not an executable regular file" }
        guard st.st_uid == 0 || st.st_uid == geteuid(), st.st_mode & (S_IWGRP | S_IWOTH) == 0 else {
            return "writable by another user"
        }
        var dir = stat()
        let parent = String(path[..<path.lastIndex(of: "/")!])
        guard stat(parent.isEmpty ? "/" : parent, &dir) == 0, dir.st_uid == 0 || dir.st_uid == geteuid(),
              dir.st_mode & (S_IWGRP | S_IWOTH) == 0 else { return "its directory is writable by another user" }
        return nil
    }

    public static func fail(_ message: String, code: Int32 = 1) -> Never {
        let text = "keyholdd: \(message)\n"
        _ = text.withCString { write(2, $0, strlen($0)) }
        exit(code)
    }
}

extension Broker {
    func closeAndExit() -> Never {
        flushRefusedBursts(all: true)
        _ = withStore { store -> Bool in
            closeVault(store)
            exit(0)
        }
        exit(0)
    }
}
