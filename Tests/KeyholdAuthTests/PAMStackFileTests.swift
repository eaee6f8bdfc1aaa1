import Foundation
import KeyholdTestSupport
import Testing

/// The shipped stacks and their test twins must agree where it matters.
@Suite struct PAMStackFileTests {
    static let pamDir = PAMFixture.repoRoot.appendingPathComponent("pam").path

    static func rules(_ path: String) -> [[String]] {
        let text = (try? String(contentsOfFile: path, encoding: .utf8)) ?? ""
        return text.split(separator: "\n").map { $0.trimmingCharacters(in: .whitespaces) }
            .filter { !$0.isEmpty && !$0.hasPrefix("#") }
            .map { $0.split(separator: " ", omittingEmptySubsequences: true).map(String.init) }
    }

    @Test(arguments: ["keyhold", "keyhold-biometry", "keyhold-passcode"])
    func productionAndTestStacksMatchInShape(service: String) {
        let prod = Self.rules(Self.pamDir + "/" + service)
        // The stacks as tests use them (pam_matrix's path filled in for this architecture);
        // the files themselves name no architecture.
        let test = Self.rules(PAMTestStacks.directory + "/" + service)
        let raw = (try? String(contentsOfFile: Self.pamDir + "/test/" + service, encoding: .utf8)) ?? "-linux-gnu"
        #expect(!raw.contains("-linux-gnu"))
        #expect(!prod.isEmpty && prod.count == test.count)
        for (p, t) in zip(prod, test) {
            #expect(p[0] == t[0] && p[1] == t[1])  // same type and control
            let pm = (p[2] as NSString).lastPathComponent, tm = (t[2] as NSString).lastPathComponent
            if pm == "pam_fprintd.so" { #expect(tm == pm && Array(p.dropFirst(3)) == Array(t.dropFirst(3))) }
            if pm == "pam_unix.so" && p[0].hasSuffix("auth") { #expect(tm == "pam_matrix.so") }
            #expect(!p.contains("nullok"))
        }
        #expect(test.allSatisfy { r in !r.contains { $0.hasPrefix("passdb=") } })
        #expect(test.filter { $0[2].contains("/") }.allSatisfy { FileManager.default.fileExists(atPath: $0[2]) })
    }

    @Test func otherDeniesEverything() {
        let rules = Self.rules(Self.pamDir + "/test/other")
        #expect(Set(rules.map { $0[0] }) == ["auth", "account", "password", "session"])
        #expect(rules.allSatisfy { $0[1] == "required" && $0[2] == "pam_deny.so" })
    }

    @Test func installRefusesToOverwriteADifferingFile() throws {
        let dir = PAMFixture.tempDirectory()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        func run(_ args: [String]) throws -> Int32 {
            let p = Process()
            p.executableURL = URL(fileURLWithPath: Self.pamDir + "/install.sh")
            p.arguments = args
            p.standardOutput = FileHandle.nullDevice
            p.standardError = FileHandle.nullDevice
            try p.run()
            p.waitUntilExit()
            return p.terminationStatus
        }
        #expect(try run(["--dest", dir]) == 0)
        #expect(try run(["--dest", dir]) == 0)  // identical: nothing to do
        PAMFixture.write("auth required pam_permit.so\n", to: dir + "/keyhold-passcode")
        #expect(try run(["--dest", dir]) == 1)
        #expect(try String(contentsOfFile: dir + "/keyhold-passcode", encoding: .utf8) == "auth required pam_permit.so\n")
        #expect(try run(["--dest", dir, "--force"]) == 0)
        #expect(FileManager.default.contentsEqual(atPath: dir + "/keyhold-passcode", andPath: Self.pamDir + "/keyhold-passcode"))
        #expect(try run(["--bogus"]) == 2)
    }
}
