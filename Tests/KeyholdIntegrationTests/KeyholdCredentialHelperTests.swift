import Foundation
import Glibc
import Testing
import KeyholdTestSupport

/// git-credential-keyhold and docker-credential-keyhold against the real broker, driven by real
/// git (over smart HTTP with Basic auth on 127.0.0.1), the docker CLI and skopeo.
@Suite struct KeyholdCredentialHelperTests {
    func items(_ b: BrokerFixture) -> [String] {
        b.cli(["ls", "--json"]).stdoutText.split(separator: "\n").map(String.init)
    }

    // MARK: git over HTTP

    /// Clone asks once and stores; push needs no prompt; a server password change makes the
    /// fetch fail, git rejects and the stale credential is erased; the next fetch stores the new one.
    @Test func gitOverHTTPStoresReusesAndReplacesAfterRejection() throws {
        let b = try BrokerFixture()
        let server = try GitHTTPServer(passwords: ["alice": "pw-1"])
        let g = try GitClient(b)
        let prompts = b.directory + "/prompts"
        let ask = g.askpass("ask-pw1", answer: "pw-1", log: prompts)
        let work = b.directory + "/clone"
        let clone = g.git(["clone", "-q", server.url(user: "alice"), work], environment: ["GIT_ASKPASS": ask])
        #expect(clone.status == 0, "\(clone.stderr)")
        #expect(lines(prompts).count == 1, "git asked once: \(lines(prompts))")
        let service = "git:http://127.0.0.1:\(server.port)"
        expectSecret(b.cli(["get", service, "alice"]).stdoutText, equals: "pw-1")
        #expect(items(b).contains { $0.contains("\"service\":\"\(service)\"") && $0.contains("\"kind\":\"password\"") })

        // Push: no prompt at all (an askpass that would cancel and log).
        let never = g.askpass("never", answer: nil, log: prompts)
        g.git(["-C", work, "commit", "-q", "--allow-empty", "-m", "next"])
        let push = g.git(["-C", work, "push", "-q", "origin", "main"], environment: ["GIT_ASKPASS": never])
        #expect(push.status == 0, "\(push.stderr)")
        #expect(lines(prompts).count == 1)
        #expect(server.requests.contains { $0.hasPrefix("POST /repo.git/git-receive-pack alice") })

        // The server's password changes: the stored one fails, git rejects it, the helper erases it.
        server.setPasswords(["alice": "pw-2"])
        let failed = g.git(["-C", work, "fetch", "-q"], environment: ["GIT_ASKPASS": never])
        #expect(failed.status != 0)
        #expect(b.cli(["state", service, "alice"]).stdoutText == "not-found\n", "the stale credential was erased")

        // The next fetch asks (askpass), succeeds and stores the new password.
        let ask2 = g.askpass("ask-pw2", answer: "pw-2", log: prompts)
        let fetch = g.git(["-C", work, "fetch", "-q"], environment: ["GIT_ASKPASS": ask2])
        #expect(fetch.status == 0, "\(fetch.stderr)")
        expectSecret(b.cli(["get", service, "alice"]).stdoutText, equals: "pw-2")

        // Audited, found by the item's name (which holds slashes).
        let audit = b.cli(["audit", "--json", "--item", "\(service)/alice"])
        #expect(audit.status == 0, "\(audit.stderr)")
        // The helper's releases (git's `get`), not only its stores, are in the audit.
        let releases = audit.stdoutText.split(separator: "\n").filter {
            $0.contains("\"operation\":\"get\"") && $0.contains("git-credential-keyhold") && $0.contains("\"granted\"")
        }
        #expect(!releases.isEmpty, "\(audit.stdoutText)")
    }

    @Test func twoAccountsOnOneHostStayApart() throws {
        let b = try BrokerFixture()
        let server = try GitHTTPServer(passwords: ["alice": "a-pw", "bob": "b-pw"])
        let g = try GitClient(b)
        let log = b.directory + "/prompts"
        for (user, pw) in [("alice", "a-pw"), ("bob", "b-pw")] {
            let r = g.git(["clone", "-q", server.url(user: user), b.directory + "/\(user)"],
                          environment: ["GIT_ASKPASS": g.askpass("ask-\(user)", answer: pw, log: log)])
            #expect(r.status == 0, "\(r.stderr)")
        }
        let never = g.askpass("never", answer: nil, log: log)
        for user in ["alice", "bob"] {
            #expect(g.git(["-C", b.directory + "/\(user)", "fetch", "-q"], environment: ["GIT_ASKPASS": never]).status == 0)
        }
        #expect(lines(log).count == 2)
        let service = "git:http://127.0.0.1:\(server.port)"
        expectSecret(b.cli(["get", service, "alice"]).stdoutText, equals: "a-pw")
        expectSecret(b.cli(["get", service, "bob"]).stdoutText, equals: "b-pw")
        // Without a username and with two stored, the helper answers nothing (git would ask).
        let r = helper("git-credential-keyhold", ["get"], stdin: "protocol=http\nhost=127.0.0.1:\(server.port)\n", broker: b)
        #expect(r.status == 0 && r.stdout.isEmpty)
    }

    // MARK: git credential fill / approve / reject

    @Test func fillApproveRejectThroughGitCredential() throws {
        let b = try BrokerFixture()
        let g = try GitClient(b, config: ["[credential]", "\tuseHttpPath = true"])
        let base = ["protocol=https", "host=git.example"]
        #expect(g.credential("approve", base + ["path=team/a.git", "username=alice", "password=for-a"]).status == 0)
        #expect(g.credential("approve", base + ["path=team/b.git", "username=alice", "password=for-b"]).status == 0)
        let fill = g.credential("fill", base + ["path=team/a.git"])
        let filledForA = fill.stdoutText.contains("username=alice\npassword=for-a\n")
        #expect(fill.status == 0 && filledForA, "\(fill.stderr)")
        expectSecret(b.cli(["get", "git:https://git.example/team/b.git", "alice"]).stdoutText, equals: "for-b")
        // A reject with the stored password erases only that path's item.
        #expect(g.credential("reject", base + ["path=team/a.git", "username=alice", "password=for-a"]).status == 0)
        #expect(b.cli(["state", "git:https://git.example/team/a.git", "alice"]).stdoutText == "not-found\n")
        #expect(b.cli(["state", "git:https://git.example/team/b.git", "alice"]).stdoutText == "available\n")
    }

    @Test func rejectWithAStalePasswordKeepsTheNewerOne() throws {
        let b = try BrokerFixture()
        let g = try GitClient(b)
        let desc = ["protocol=https", "host=git.example", "username=alice"]
        #expect(g.credential("approve", desc + ["password=old"]).status == 0)
        #expect(g.credential("approve", desc + ["password=new"]).status == 0)
        expectSecret(b.cli(["get", "git:https://git.example", "alice"]).stdoutText, equals: "new")
        #expect(g.credential("reject", desc + ["password=old"]).status == 0)
        expectSecret(b.cli(["get", "git:https://git.example", "alice"]).stdoutText, equals: "new", "a stale reject deletes nothing")
        #expect(g.credential("reject", desc + ["password=new"]).status == 0)
        #expect(b.cli(["state", "git:https://git.example", "alice"]).stdoutText == "not-found\n")
    }

    /// git 2.39 does not pass these to helpers, so the helper is driven directly; a newer git
    /// (2.41+) is driven too when one is installed.
    @Test func expiryAndRefreshTokenRoundTrip() throws {
        let b = try BrokerFixture()
        let future = Int(time(nil)) + 3600
        let store = "protocol=https\nhost=git.example\nusername=alice\npassword=pw\npassword_expiry_utc=\(future)\noauth_refresh_token=rt-1\n"
        #expect(helper("git-credential-keyhold", ["store"], stdin: store, broker: b).status == 0)
        let got = helper("git-credential-keyhold", ["get"], stdin: "protocol=https\nhost=git.example\n", broker: b)
        expectSecret(got.stdoutText, equals: "username=alice\npassword=pw\npassword_expiry_utc=\(future)\noauth_refresh_token=rt-1\n", "\(got.stderr)")
        #expect(items(b).contains { $0.contains("\"kind\":\"refresh-token\"") })
        // One expiry: the item's own (authenticated; `ls`/`state` show it), not the label or secret.
        let iso = b.cli(["state", "git:https://git.example", "alice", "--json"]).stdoutText
        #expect(items(b).contains { $0.contains("\"expires\":\"") && $0.contains("\"label\":\"git credential\"") }, "\(items(b))")
        #expect(iso.contains("\"state\":\"available\"") && !iso.contains("\"expires\":null"), "\(iso)")
        let expiryInSecret = b.cli(["get", "git:https://git.example", "alice"]).stdoutText.contains("password_expiry_utc")
        #expect(!expiryInSecret)
        // An expired item stored with `keyhold put --expires` is not given to git either.
        #expect(b.cli(["put", "git:https://dated.example", "dan", "--expires", "@1000"], stdin: Array("pw".utf8)).status == 0)
        #expect(b.cli(["state", "git:https://dated.example", "dan"]).stdoutText == "expired\n")
        for lookup in ["protocol=https\nhost=dated.example\nusername=dan\n", "protocol=https\nhost=dated.example\n"] {
            let expired = helper("git-credential-keyhold", ["get"], stdin: lookup, broker: b)
            #expect(expired.status == 0 && expired.stdout.isEmpty, "\(expired.stdout.count) bytes on stdout")
        }
        let released = b.cli(["audit", "--json", "--item", "git:https://dated.example/dan"]).stdoutText
        #expect(released.contains("\"operation\":\"put\"") && !released.contains("\"operation\":\"get\""), "the expired item was never opened: \(released)")

        // An expired item in the format of helpers before item expiries (made by hand) is never returned, looked up
        // by username (the stored expiry) or without one (the label, checked before release).
        let blob = [UInt8(0)] + Array("keyhold-git\npassword=pw\npassword_expiry_utc=1000\n".utf8)
        #expect(b.cli(["put", "git:https://old.example", "bob", "--label", "password_expiry_utc=1000"], stdin: blob).status == 0)
        for lookup in ["protocol=https\nhost=old.example\nusername=bob\n", "protocol=https\nhost=old.example\n"] {
            let expired = helper("git-credential-keyhold", ["get"], stdin: lookup, broker: b)
            #expect(expired.status == 0 && expired.stdout.isEmpty, "\(expired.stdout.count) bytes on stdout")
        }
        // An already-expired credential is not stored.
        let late = "protocol=https\nhost=late.example\nusername=c\npassword=pw\npassword_expiry_utc=1000\n"
        #expect(helper("git-credential-keyhold", ["store"], stdin: late, broker: b).status == 0)
        #expect(b.cli(["state", "git:https://late.example", "c"]).stdoutText == "not-found\n")

        let version = runCommand("/usr/bin/git", ["version"]).stdoutText
        let parts = version.split(separator: " ").last?.split(separator: ".").compactMap { Int($0.prefix { $0.isNumber }) } ?? []
        if parts.count >= 2, (parts[0], parts[1]) >= (2, 41) {
            let g = try GitClient(b)
            let fill = g.credential("fill", ["protocol=https", "host=git.example"])
            let filledWithToken = fill.stdoutText.contains("password_expiry_utc=\(future)") && fill.stdoutText.contains("oauth_refresh_token=rt-1")
            #expect(filledWithToken)
        } else {
            print("git \(version.trimmingCharacters(in: .whitespacesAndNewlines)) predates 2.41: the round trip through git itself is not run")
        }
    }

    // MARK: gated items

    @Test func gatedItemPromptsThroughGitAskpass() throws {
        let b = try BrokerFixture()
        let g = try GitClient(b, helper: "keyhold --policy device-passcode")
        #expect(g.credential("approve", ["protocol=https", "host=git.example", "username=alice", "password=gated-pw"]).status == 0)
        #expect(items(b).contains { $0.contains("\"policy\":\"device-passcode\"") })
        let log = b.directory + "/prompts"
        let pam = g.askpass("pam", answer: "right-password", log: log)
        let fill = g.credential("fill", ["protocol=https", "host=git.example"], environment: ["GIT_ASKPASS": pam])
        let filledGated = fill.stdoutText.contains("password=gated-pw")
        #expect(fill.status == 0 && filledGated, "\(fill.stderr)")
        #expect(lines(log).count == 1, "the broker's prompt, through GIT_ASKPASS: \(lines(log))")
    }

    @Test func gatedItemWithoutInteractionLetsGitPromptItself() throws {
        let b = try BrokerFixture()
        let g = try GitClient(b, helper: "keyhold --policy device-passcode")
        let desc = ["protocol=https", "host=git.example", "username=alice"]
        #expect(g.credential("approve", desc + ["password=gated-pw"]).status == 0)
        // No terminal, no GIT_ASKPASS/KEYHOLD_ASKPASS: git's own prompt (core.askPass) answers.
        let log = b.directory + "/git-prompts"
        let own = g.askpass("own", answer: "typed-pw", log: log)
        // (env -u: git takes an empty GIT_ASKPASS as set, and would not look at core.askPass.)
        let fill = runCommand("/usr/bin/env", ["-u", "GIT_ASKPASS", "-u", "SSH_ASKPASS", "git", "-c", "core.askPass=\(own)", "credential", "fill"],
                              stdin: Array("protocol=https\nhost=git.example\n\n".utf8), environment: g.environment())
        let filledTyped = fill.stdoutText.contains("password=typed-pw")
        #expect(fill.status == 0 && filledTyped, "\(fill.stderr)")
        let why = fill.stderr.split(separator: "\n").filter { $0.contains("needs authentication") }
        #expect(why.count == 1, "said once: \(fill.stderr)")
        #expect(!fill.stderr.contains("gated-pw"))
        // A reject without interaction keeps the item and says why.
        let reject = g.credential("reject", desc + ["password=gated-pw"])
        #expect(reject.status == 0 && reject.stderr.contains("kept"), "\(reject.stderr)")
        #expect(b.cli(["state", "git:https://git.example", "alice"]).stdoutText == "requires-authentication\n")
        // With an askpass the comparison can be made, and the item goes.
        let pam = g.askpass("pam", answer: "right-password", log: log)
        #expect(g.credential("reject", desc + ["password=gated-pw"], environment: ["KEYHOLD_ASKPASS": pam]).status == 0)
        #expect(b.cli(["state", "git:https://git.example", "alice"]).stdoutText == "not-found\n")
    }

    // MARK: bad input, other users, no broker

    @Test func gitHelperRefusesBadInputWholeAndNeverEchoesASecret() throws {
        let b = try BrokerFixture()
        let cases: [(String, String)] = [
            ("protocol=https\nhost=h\nusername=u\npassword=sec\u{0}ret-1\n", "NUL"),
            ("protocol=https\nhost=h\nusername=u\npassword=secret-2\nnot a line\n", "no '='"),
            ("protocol=https\nhost=h\nusername=u\npassword=" + String(repeating: "x", count: 70_000) + "\n", "exceeds"),
            ("protocol=https\nhost=h\nusername=u\nx=" + String(repeating: "y", count: 600_000) + "\npassword=secret-3\n", "exceeds"),
            ("protocol=https\nhost=h\npassword=secret-4\n", "needs protocol, host, username and password"),
        ]
        for (input, why) in cases {
            let r = helper("git-credential-keyhold", ["store"], stdin: input, broker: b)
            #expect(r.status == 2 && r.stdout.isEmpty, "\(why): \(r.status)")
            #expect(r.stderr.split(separator: "\n").count == 1 && r.stderr.contains(why), "\(r.stderr)")
            #expect(!r.stderr.contains("secret") && !r.stderr.contains("xxxx"))
        }
        #expect(items(b).isEmpty, "nothing stored half-way")
        // Unknown actions and attributes are ignored, not errors.
        #expect(helper("git-credential-keyhold", ["frobnicate"], stdin: "", broker: b).status == 0)
        let odd = helper("git-credential-keyhold", ["store"], stdin: "protocol=https\nhost=h\nusername=u\npassword=p\nfuture_thing=1\nwwwauth[]=Basic\n", broker: b)
        #expect(odd.status == 0 && items(b).count == 1, "\(odd.stderr)")
        #expect(helper("git-credential-keyhold", ["--policy", "bogus", "get"], stdin: "", broker: b).status == 2)
    }

    @Test func missingBrokerIsOneLineForBothHelpers() throws {
        let b = try BrokerFixture()
        b.stop()
        let git = helper("git-credential-keyhold", ["get"], stdin: "protocol=https\nhost=h\n", broker: b)
        #expect(git.status == 11 && git.stdout.isEmpty && git.stderr.split(separator: "\n").count == 1, "\(git.stderr)")
        let docker = helper("docker-credential-keyhold", ["get"], stdin: "r.example\n", broker: b)
        #expect(docker.status == 1 && docker.stderr.split(separator: "\n").count == 1 && docker.stderr.contains("broker"), "\(docker.stderr)")
        #expect(!docker.stdoutText.contains("credentials not found"), "an outage is not a miss")
    }

    @Test func anotherUsersHelpersSeeNoneOfTheseItems() throws {
        let b = try BrokerFixture()
        let other = try TestUser()
        #expect(helper("git-credential-keyhold", ["store"], stdin: "protocol=https\nhost=h\nusername=u\npassword=mine\n", broker: b).status == 0)
        #expect(helper("docker-credential-keyhold", ["store"], stdin: #"{"ServerURL":"r.example","Username":"u","Secret":"mine"}"#, broker: b).status == 0)
        let git = helper("git-credential-keyhold", ["get"], stdin: "protocol=https\nhost=h\nusername=u\n", broker: b, asUser: other.name)
        #expect(git.status == 0 && git.stdout.isEmpty, "\(git.stderr)")
        let list = helper("docker-credential-keyhold", ["list"], stdin: "", broker: b, asUser: other.name)
        #expect(list.status == 0 && list.stdoutText == "{}\n", "\(list.stderr)")
        let get = helper("docker-credential-keyhold", ["get"], stdin: "r.example", broker: b, asUser: other.name)
        #expect(get.status == 1 && get.stdoutText == "credentials not found in native keychain\n")
        // Their erase reaches nothing of ours.
        _ = helper("docker-credential-keyhold", ["erase"], stdin: "r.example", broker: b, asUser: other.name)
        #expect(b.cli(["state", "docker:r.example", "u"]).stdoutText == "available\n")
    }
}

// MARK: docker-credential protocol

extension KeyholdCredentialHelperTests {
    func docker(_ b: BrokerFixture, _ action: String, _ stdin: String) -> CommandResult {
        helper("docker-credential-keyhold", [action], stdin: stdin, broker: b)
    }

    @Test func dockerProtocolStoreGetListEraseAndTheThreeURLForms() throws {
        let b = try BrokerFixture()
        #expect(docker(b, "store", #"{"ServerURL":"https://registry.example:5000","Username":"alice","Secret":"t\"ok"}"#).status == 0)
        for form in ["registry.example:5000", "http://registry.example:5000", "https://registry.example:5000/v2/"] {
            let r = docker(b, "get", form + "\n")
            #expect(r.status == 0, "\(form): \(r.stderr)")
            expectSecret(r.stdoutText, equals: #"{"ServerURL":"\#(form)","Username":"alice","Secret":"t\"ok"}"# + "\n", "\(form)")
        }
        #expect(items(b).contains { $0.contains("\"service\":\"docker:registry.example:5000\"") && $0.contains("\"kind\":\"password\"") })
        // Identity tokens round-trip; one credential per registry (the new one replaces alice).
        #expect(docker(b, "store", #"{"ServerURL":"registry.example:5000","Username":"<token>","Secret":"id-tok"}"#).status == 0)
        let identityToken = docker(b, "get", "registry.example:5000").stdoutText.contains(#""Username":"<token>","Secret":"id-tok""#)
        #expect(identityToken)
        #expect(docker(b, "store", #"{"ServerURL":"other.example","Username":"bob","Secret":"b"}"#).status == 0)
        #expect(b.cli(["put", "git:https://git.example", "carol"], stdin: Array("not-a-registry".utf8)).status == 0)
        #expect(docker(b, "list", "").stdoutText == #"{"other.example":"bob","registry.example:5000":"<token>"}"# + "\n")
        #expect(docker(b, "erase", "https://registry.example:5000\n").status == 0)
        let miss = docker(b, "get", "registry.example:5000")
        #expect(miss.status == 1 && miss.stdoutText == "credentials not found in native keychain\n" && miss.stderr.isEmpty)
        let missErase = docker(b, "erase", "registry.example:5000")
        #expect(missErase.status == 1 && missErase.stdoutText == "credentials not found in native keychain\n")
        #expect(b.cli(["audit", "--json", "--item", "docker:other.example/bob"]).stdoutText.contains("docker-credential-keyhold"))
    }

    @Test func dockerHelperRefusesBadInputWhole() throws {
        let b = try BrokerFixture()
        let cases = [#"{"ServerURL":"r","Username":"u","Secret":"zqsekrit"#, "not json", #"{"ServerURL":"r","Username":"u"}"#,
                     "{\"ServerURL\":\"r\",\"Username\":\"u\",\"Secret\":\"zqsek\u{0}rit\"}",
                     #"{"ServerURL":"r","Username":"u","Secret":""# + String(repeating: "s", count: 70_000) + "\"}",
                     String(repeating: " ", count: 600_000)]
        for input in cases {
            let r = docker(b, "store", input)
            #expect(r.status == 1 && r.stderr.split(separator: "\n").count == 1, "\(r.stderr)")
            #expect(!r.stderr.contains("zqsek") && !r.stdoutText.contains("zqsek"))
        }
        #expect(items(b).isEmpty)
        #expect(docker(b, "get", "\n").status == 1)
        #expect(docker(b, "bogus", "").status == 1)
    }

    /// The docker CLI with `credsStore`: `docker logout` erases through the helper (it needs no
    /// registry). Runs where a docker CLI is installed.
    @Test func dockerLogoutWithCredsStore() throws {
        let candidates: [String] = ["/usr/bin/docker", "/usr/local/bin/docker"]
        guard let dockerCLI = candidates.first(where: { FileManager.default.isExecutableFile(atPath: $0) }) else {
            print("no docker CLI installed: docker logout not exercised")
            return
        }
        let b = try BrokerFixture()
        let config = b.directory + "/docker"
        mkdir(config, 0o700)
        try #"{"credsStore":"keyhold"}"#.write(toFile: config + "/config.json", atomically: true, encoding: .utf8)
        #expect(docker(b, "store", #"{"ServerURL":"https://registry.example:5000","Username":"alice","Secret":"tok"}"#).status == 0)
        let env = ["DOCKER_CONFIG": config, "KEYHOLD_SOCKET": b.socketPath, "PATH": TestPaths.products + ":/usr/bin:/bin"]
        let out = runCommand(dockerCLI, ["logout", "registry.example:5000"], environment: env)
        #expect(out.status == 0, "\(out.stdoutText) \(out.stderr)")
        #expect(b.cli(["state", "docker:registry.example:5000", "alice"]).stdoutText == "not-found\n", "\(out.stdoutText) \(out.stderr)")
    }

    /// skopeo (containers-auth.json `credHelpers`): `login --get-login` reads through the helper,
    /// `logout` erases through it.
    @Test func skopeoWithCredHelpers() throws {
        guard FileManager.default.isExecutableFile(atPath: "/usr/bin/skopeo") else {
            Issue.record("skopeo is not installed (scripts/setup.sh installs it)")
            return
        }
        let b = try BrokerFixture()
        let auth = b.directory + "/auth.json"
        try #"{"credHelpers":{"registry.example:5000":"keyhold"}}"#.write(toFile: auth, atomically: true, encoding: .utf8)
        #expect(docker(b, "store", #"{"ServerURL":"registry.example:5000","Username":"alice","Secret":"tok"}"#).status == 0)
        let env = ["KEYHOLD_SOCKET": b.socketPath, "PATH": TestPaths.products + ":/usr/bin:/bin", "HOME": b.directory]
        let who = runCommand("/usr/bin/skopeo", ["login", "--authfile", auth, "--get-login", "registry.example:5000"], environment: env)
        #expect(who.status == 0 && who.stdoutText == "alice\n", "\(who.stdoutText) \(who.stderr)")
        let out = runCommand("/usr/bin/skopeo", ["logout", "--authfile", auth, "registry.example:5000"], environment: env)
        #expect(out.status == 0, "\(out.stderr)")
        #expect(b.cli(["state", "docker:registry.example:5000", "alice"]).stdoutText == "not-found\n")
        let none = runCommand("/usr/bin/skopeo", ["login", "--authfile", auth, "--get-login", "registry.example:5000"], environment: env)
        #expect(none.status != 0)
    }
}
