import Glibc
import KeyholdCLI

// keyhold: the command-line client. All logic lives in KeyholdCLI.
exit(KeyholdCommand.main(Array(CommandLine.arguments.dropFirst())))
