// The Debian package: scripts/package.sh builds it from a release build, and these tests read
// what it holds (files, control fields, conffiles, maintainer scripts, how each program links)
// and run lintian on it. SystemdNspawnTests installs the same package in a booted Debian 12.
import Foundation
import Glibc
import Testing
import KeyholdCore
import KeyholdTestSupport

/// The package, built once per test process by `scripts/package.sh` (a release build of every
/// program, in its own scratch directory: `swift test` may hold `.build`'s lock meanwhile).
enum DebianPackage {
    /// Why the package cannot be built here, or nil.
    static let missingTools: String? = {
        for tool in ["dpkg-deb", "dpkg-gencontrol", "dpkg-shlibdeps", "strip", "swift"] where which(tool) == nil {
            return "\(tool) is not installed (scripts/setup.sh installs dpkg-dev and binutils)"
        }
        return nil
    }()

    /// The build, started by the first test that needs it. Awaited, not waited for: a release
    /// build takes minutes and must not hold one of the test runner's few threads meanwhile.
    static let build = Task<Result<String, PackageError>, Never> {
        let out = TestPaths.temporaryDirectory("khdeb")
        let r = await runAwaited(seconds: 3600, TestPaths.repository + "/scripts/package.sh",
                                 ["--scratch-path", TestPaths.repository + "/.build-package", "--out", out])
        let deb = "\(out)/keyhold_\(KeyholdVersion.string)_\(architecture).deb"
        guard r.status == 0, access(deb, R_OK) == 0 else {
            return .failure(PackageError(text: "scripts/package.sh exited \(r.status): \(r.output.suffix(3000))"))
        }
        return .success(deb)
    }

    static let architecture: String = runCommand("/usr/bin/dpkg", ["--print-architecture"]).stdoutText
        .trimmingCharacters(in: .whitespacesAndNewlines)

    static func path() async throws -> String { try await build.value.get() }

    /// The package's files as `dpkg-deb -c` lists them, without the leading "./".
    static func files(_ deb: String) -> [String] {
        let r = runCommand("/usr/bin/dpkg-deb", ["-c", deb])
        return r.stdoutText.split(separator: "\n").compactMap { line in
            line.split(separator: " ", omittingEmptySubsequences: true).last.map { String($0.dropFirst(2)) }
        }
    }

    static func field(_ deb: String, _ name: String) -> String {
        runCommand("/usr/bin/dpkg-deb", ["-f", deb, name]).stdoutText.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// Package names in a Depends-style field: the first of each alternative, without versions.
    static func names(inField text: String) -> [String] {
        text.split(separator: ",").compactMap { clause in
            clause.split(separator: "|").first?.split(separator: "(").first?
                .trimmingCharacters(in: .whitespaces)
        }.filter { !$0.isEmpty }
    }

    static func which(_ tool: String) -> String? {
        for dir in ["/usr/bin", "/usr/sbin", "/bin", "/sbin", "/opt/swift/usr/bin", "/usr/share/swift/usr/bin"]
        where access("\(dir)/\(tool)", X_OK) == 0 { return "\(dir)/\(tool)" }
        return nil
    }
}

struct PackageError: Error, CustomStringConvertible {
    let text: String
    var description: String { text }
}

/// `runCommand` under coreutils' timeout: SIGTERM after `seconds`, SIGKILL 10 s later.
@discardableResult
func runBounded(seconds: Int, _ path: String, _ arguments: [String], stdin: [UInt8] = [],
                environment: [String: String] = [:]) -> CommandResult {
    runCommand("/usr/bin/timeout", ["-k", "10", String(seconds), path] + arguments, stdin: stdin, environment: environment)
}

/// Runs `path` under coreutils' timeout like `runBounded`, stdin from /dev/null, its output
/// and errors together in a file, and suspends (holding no thread) until it exits.
func runAwaited(seconds: Int, _ path: String, _ arguments: [String]) async -> (status: Int32, output: String) {
    let log = TestPaths.temporaryDirectory("khlog") + "/output"
    guard FileManager.default.createFile(atPath: log, contents: nil), let sink = FileHandle(forWritingAtPath: log) else {
        return (-1, "cannot create \(log)")
    }
    let p = Process()
    p.executableURL = URL(fileURLWithPath: "/usr/bin/timeout")
    p.arguments = ["-k", "10", String(seconds), path] + arguments
    p.standardInput = FileHandle.nullDevice
    p.standardOutput = sink
    p.standardError = sink
    let status: Int32 = await withCheckedContinuation { done in
        p.terminationHandler = { done.resume(returning: $0.terminationStatus) }
        do { try p.run() } catch { p.terminationHandler = nil; done.resume(returning: -1) }
    }
    try? sink.close()
    return (status, (try? String(contentsOfFile: log, encoding: .utf8)) ?? "")
}

@Suite(.serialized, .enabled(if: DebianPackage.missingTools == nil, "cannot build the package: \(DebianPackage.missingTools ?? "")"))
struct PackageTests {
    static let programs = ["usr/sbin/keyholdd", "usr/sbin/keyhold-pam-helper", "usr/bin/keyhold",
                           "usr/bin/git-credential-keyhold", "usr/bin/docker-credential-keyhold",
                           "usr/bin/keyhold-secret-service"]
    static let manPages = ["usr/share/man/man1/keyhold.1.gz", "usr/share/man/man8/keyholdd.8.gz",
                           "usr/share/man/man8/keyhold-pam-helper.8.gz",
                           "usr/share/man/man1/keyhold-secret-service.1.gz",
                           "usr/share/man/man1/git-credential-keyhold.1.gz",
                           "usr/share/man/man1/docker-credential-keyhold.1.gz"]
    static let completions = ["usr/share/bash-completion/completions/keyhold",
                              "usr/share/zsh/vendor-completions/_keyhold",
                              "usr/share/fish/vendor_completions.d/keyhold.fish"]
    static let units = ["lib/systemd/system/keyholdd.service",
                        "usr/lib/systemd/user/keyhold-secret-service.service",
                        "usr/share/dbus-1/services/org.freedesktop.secrets.keyhold.service"]
    static let pamFiles = ["etc/pam.d/keyhold", "etc/pam.d/keyhold-biometry", "etc/pam.d/keyhold-passcode"]
    static let docs = ["usr/share/doc/keyhold/README.md.gz", "usr/share/doc/keyhold/SECURITY.md.gz",
                       "usr/share/doc/keyhold/ARCHITECTURE.md.gz", "usr/share/doc/keyhold/copyright",
                       "usr/share/doc/keyhold/changelog.gz"]

    @Test func namedAfterTheOneVersionNumber() async throws {
        let deb = try await DebianPackage.path()
        #expect(deb.hasSuffix("/keyhold_\(KeyholdVersion.string)_\(DebianPackage.architecture).deb"))
        #expect(DebianPackage.field(deb, "Package") == "keyhold")
        #expect(DebianPackage.field(deb, "Version") == KeyholdVersion.string)
        #expect(DebianPackage.field(deb, "Architecture") == DebianPackage.architecture)
    }

    @Test func holdsEveryProgramManPageCompletionUnitAndPAMFile() async throws {
        let files = Set(DebianPackage.files(try await DebianPackage.path()))
        for f in Self.programs + Self.manPages + Self.completions + Self.units + Self.pamFiles + Self.docs {
            #expect(files.contains(f), "missing from the package: /\(f)")
        }
        // Nothing the broker creates itself, and no test stack.
        #expect(!files.contains { $0.hasPrefix("var/") || $0.hasPrefix("run/") || $0.contains("pam.d/other") })
    }

    /// Every shared library a program needs is named by its Debian package; the ones the
    /// broker loads at run time without a link (the TPM's device TCTI, pam_unix) by hand.
    @Test func declaresTheRuntimeDependenciesByDebianPackageName() async throws {
        let depends = Set(DebianPackage.names(inField: DebianPackage.field(try await DebianPackage.path(), "Depends")))
        for name in ["libsodium23", "libsqlite3-0", "libsystemd0", "libpam0g", "libssl3", "libtss2-esys-3.0.2-0",
                     "libtss2-tctildr0", "libtss2-tcti-device0", "libpam-modules", "init-system-helpers", "libc6"] {
            #expect(depends.contains(name), "Depends lacks \(name): \(depends.sorted())")
        }
        // No Swift toolchain: nothing of it is a dependency.
        #expect(!depends.contains { $0.contains("swift") })
    }

    /// The Swift runtime is inside every program: none needs a libswift*.so, and the three
    /// that run once per request (keyhold, the credential helpers) need no loader at all.
    @Test func programsCarryTheSwiftRuntime() async throws {
        let root = TestPaths.temporaryDirectory("khx")
        #expect(runCommand("/usr/bin/dpkg-deb", ["-x", try await DebianPackage.path(), root]).status == 0)
        for program in Self.programs {
            let r = runCommand("/usr/bin/readelf", ["-d", "-l", "\(root)/\(program)"])
            #expect(r.status == 0, "readelf \(program): \(r.stderr)")
            let needed = r.stdoutText.split(separator: "\n").filter { $0.contains("(NEEDED)") }
            #expect(!needed.contains { $0.contains("libswift") || $0.contains("libFoundation") || $0.contains("libdispatch") },
                    "\(program) needs the Swift runtime: \(needed)")
            if ["usr/bin/keyhold", "usr/bin/git-credential-keyhold", "usr/bin/docker-credential-keyhold"].contains(program) {
                #expect(!r.stdoutText.contains("INTERP"), "\(program) is not a static executable")
            }
        }
    }

    /// dpkg never replaces a PAM file the administrator changed; the maintainer scripts enable
    /// the broker's unit through deb-systemd-helper, create nothing, and purge keeps the vault.
    @Test func conffilesAndMaintainerScripts() async throws {
        let root = TestPaths.temporaryDirectory("khc")
        #expect(runCommand("/usr/bin/dpkg-deb", ["-e", try await DebianPackage.path(), root]).status == 0)
        let conffiles = try String(contentsOfFile: root + "/conffiles", encoding: .utf8)
        #expect(Set(conffiles.split(separator: "\n").map(String.init)) == Set(Self.pamFiles.map { "/" + $0 }))
        let postinst = try String(contentsOfFile: root + "/postinst", encoding: .utf8)
        #expect(postinst.contains("deb-systemd-helper enable 'keyholdd.service'"))
        #expect(postinst.contains("deb-systemd-invoke $_dh_action 'keyholdd.service'"))
        let scripts = try ["preinst", "postinst", "prerm", "postrm"].compactMap {
            FileManager.default.fileExists(atPath: "\(root)/\($0)") ? try String(contentsOfFile: "\(root)/\($0)", encoding: .utf8) : nil
        }.joined(separator: "\n").split(separator: "\n").filter { !$0.trimmingCharacters(in: .whitespaces).hasPrefix("#") && !$0.contains("echo") }
        let makers: Set = ["mkdir", "rm", "rmdir", "install", "touch", "useradd", "adduser", "chown", "chmod", "systemd-tmpfiles"]
        for line in scripts {
            let words = line.split(whereSeparator: { " \t;&|()".contains($0) })
            #expect(!words.contains { makers.contains(String($0)) }, "a maintainer script makes or removes files: \(line)")
        }
        let postrm = try String(contentsOfFile: root + "/postrm", encoding: .utf8)
        #expect(postrm.contains("deb-systemd-helper purge 'keyholdd.service'"))
        #expect(postrm.contains("purge keeps the vault in /var/lib/keyhold"))
    }

    /// The shipped units name the programs where the package puts them, and the broker's unit
    /// points at documentation that is installed (its man page), not at /usr/local.
    @Test func unitsNameTheInstalledPaths() async throws {
        let deb = try await DebianPackage.path()
        let root = TestPaths.temporaryDirectory("khu")
        #expect(runCommand("/usr/bin/dpkg-deb", ["-x", deb, root]).status == 0)
        let files = Set(DebianPackage.files(deb))
        for unit in Self.units {
            let text = try String(contentsOfFile: "\(root)/\(unit)", encoding: .utf8)
            let settings = text.split(separator: "\n").filter { !$0.hasPrefix("#") }
            #expect(!settings.contains { $0.contains("/usr/local") }, "\(unit) names /usr/local")
            for line in text.split(separator: "\n") where line.hasPrefix("ExecStart=") || line.hasPrefix("Exec=") {
                let program = line.split(separator: "=", maxSplits: 1)[1].split(separator: " ")[0].dropFirst()
                #expect(files.contains(String(program)), "\(unit) runs /\(program), which the package lacks")
            }
            for line in text.split(separator: "\n") where line.hasPrefix("Documentation=") {
                for page in line.dropFirst("Documentation=".count).split(separator: " ") {
                    guard page.hasPrefix("man:"), let open = page.firstIndex(of: "("), let close = page.firstIndex(of: ")") else {
                        Issue.record("\(unit): documentation not a man page: \(page)"); continue
                    }
                    let name = page[page.index(page.startIndex, offsetBy: 4)..<open]
                    let section = page[page.index(after: open)..<close]
                    #expect(files.contains("usr/share/man/man\(section)/\(name).\(section).gz"), "\(unit) names \(page), not installed")
                }
            }
        }
        let broker = try String(contentsOfFile: "\(root)/lib/systemd/system/keyholdd.service", encoding: .utf8)
        #expect(!broker.contains("LimitNICE"))
    }

    /// scripts/install.sh lays out the same files from the same build (the package is staged
    /// by it), so a source install and the package do not drift apart.
    @Test func installScriptInstallsTheSameFiles() async throws {
        let packaged = Set(DebianPackage.files(try await DebianPackage.path()).filter { !$0.hasSuffix("/") && !$0.isEmpty })
        let root = TestPaths.temporaryDirectory("khi")
        let r = runBounded(seconds: 600, TestPaths.repository + "/scripts/install.sh",
                           ["--no-build", "--scratch-path", TestPaths.repository + "/.build-package",
                            "--prefix", "/usr", "--destdir", root])
        #expect(r.status == 0, "install.sh: \(r.stderr)")
        let found = runCommand("/usr/bin/find", [root, "-type", "f", "-printf", "%P\n"]).stdoutText
        // The package compresses documents over 4 KiB, as dh_compress does; install.sh does not.
        func plain(_ f: String) -> String { f.hasSuffix(".md.gz") ? String(f.dropLast(3)) : f }
        let installed = Set(found.split(separator: "\n").map(String.init))
        // The Debian-only files: changelog, copyright, lintian's overrides.
        let debianOnly: Set = ["usr/share/doc/keyhold/changelog.gz", "usr/share/doc/keyhold/copyright",
                               "usr/share/lintian/overrides/keyhold"]
        let expected = Set(packaged.subtracting(debianOnly).map(plain))
        #expect(expected == installed,
                "only in the package: \(expected.subtracting(installed).sorted()); only from install.sh: \(installed.subtracting(expected).sorted())")
    }

    /// lintian, Debian's package checker: no error. Its warnings (none when this was written)
    /// are printed for the record; the one overridden tag is explained in packaging/debian.
    @Test(.enabled(if: DebianPackage.which("lintian") != nil, "lintian is not installed (scripts/setup.sh installs it)"))
    func lintianFindsNoError() async throws {
        let r = runBounded(seconds: 600, "/usr/bin/lintian", ["--fail-on", "error", try await DebianPackage.path()])
        let tags = r.stdoutText.split(separator: "\n").filter { $0.hasPrefix("E:") || $0.hasPrefix("W:") }
        #expect(r.status == 0, "lintian: \(r.stdoutText)\(r.stderr)")
        #expect(!tags.contains { $0.hasPrefix("E:") }, "lintian errors: \(tags)")
        for warning in tags where warning.hasPrefix("W:") { print("lintian: \(warning)") }
    }
}
