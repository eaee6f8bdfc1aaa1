import Glibc
import KeyholdSecretService

// The Secret Service agent (`keyhold secret-service` execs this). See README.
do throws(AgentStartError) {
    let options = try AgentOptions.parse(Array(CommandLine.arguments.dropFirst()))
    exit(try Agent.run(options))
} catch {
    let line = "keyhold-secret-service: \(error.message)\n"
    _ = line.withCString { write(2, $0, strlen($0)) }
    exit(error.exitStatus)
}
