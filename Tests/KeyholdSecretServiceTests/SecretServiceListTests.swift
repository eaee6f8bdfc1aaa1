import Foundation
import Testing
import KeyholdTestSupport

/// `keyhold ls` shows the attribute map of an item created through the Secret Service (the
/// `ss:` account form decoded), escaped: a hostile attribute cannot put control bytes on the
/// user's terminal.
@Suite(.serialized) struct SecretServiceListTests {
    @Test func lsShowsAttributeMapsEscaped() throws {
        let f = try SecretServiceFixture()
        let r = f.python("""
            import secretstorage
            conn = secretstorage.dbus_init()
            coll = secretstorage.get_default_collection(conn)
            coll.create_item("app item", {"application": "myapp", "user": "a\\x1b[31mb&c=d"}, b"v")
            """)
        #expect(r.status == 0, "\(r.stderr) \(f.log("agent.log"))")
        #expect(f.cli(["put", "plain.example", "ann"], stdin: "p").status == 0)

        let ls = f.cli(["ls"])
        #expect(ls.status == 0, "\(ls.stderr)")
        let lines = ls.stdoutText.split(separator: "\n")
        #expect(lines.first?.hasSuffix("ATTRIBUTES") == true, "\(ls.stdoutText)")
        #expect(lines.contains { $0.contains("application=myapp") && $0.contains("user=a") && $0.contains("b&c=d") }, "\(ls.stdoutText)")
        #expect(lines.contains { $0.contains("plain.example") && $0.contains("account=ann service=plain.example") }, "\(ls.stdoutText)")
        #expect(!ls.stdoutText.utf8.contains(0x1B), "raw escape byte on the terminal")

        let json = f.cli(["ls", "--json"])
        let objects = json.stdoutText.split(separator: "\n").compactMap {
            try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]
        }
        #expect(objects.count == 2, "\(json.stdoutText)")
        let maps = objects.compactMap { $0["attributes"] as? [String: String] }
        #expect(maps.contains { $0["application"] == "myapp" && $0["user"] == "a\u{1B}[31mb&c=d" && $0["service"] == nil }, "\(json.stdoutText)")
        #expect(maps.contains { $0 == ["service": "plain.example", "account": "ann"] }, "\(json.stdoutText)")
    }
}
