import Glibc
import KeyholdCLI

// keyhold: the command-line client. All logic lives in KeyholdCLI.
let arguments = Array(CommandLine.arguments.dropFirst())
if let status = SecretServiceCommand.run(arguments) { exit(status) }
exit(KeyholdCommand.main(arguments))
