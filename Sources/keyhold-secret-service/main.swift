import Glibc
import KeyholdCore
import KeyholdSecretService

// The Secret Service agent (`keyhold secret-service` execs this). See README.
let arguments = Array(CommandLine.arguments.dropFirst())
let help = """
    \(AgentOptions.usage)

    The Secret Service agent: owns org.freedesktop.secrets on your session bus and forwards
    every call to the Keyhold broker as you. It holds no key and refuses to run as root.

      --socket PATH            broker socket (else $KEYHOLD_SOCKET, else /run/keyhold/keyhold.sock)
      --default-policy EXPR    policy of items created through D-Bus (default none)
      --reuse SECONDS          their reuse window, 0-300 (default 60)
      --replace                take the name over from the program that owns it
      --version                print the version and exit
    """
if let answer = KeyholdVersion.standardAnswer(arguments, program: "keyhold-secret-service", help: help) {
    print(answer, terminator: "")
    exit(0)
}
do throws(AgentStartError) {
    let options = try AgentOptions.parse(arguments)
    exit(try Agent.run(options))
} catch {
    let line = "keyhold-secret-service: \(error.message)\n"
    _ = line.withCString { write(2, $0, strlen($0)) }
    exit(error.exitStatus)
}
