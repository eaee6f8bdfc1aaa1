import Glibc
import KeyholdBroker
import KeyholdCore

// keyholdd: the broker daemon. Each PAM transaction runs in keyhold-pam-helper, found next
// to this executable (see KeyholdAuth/PAMHelperProcess.swift).
let arguments = Array(CommandLine.arguments.dropFirst())
if arguments.first == "--version" {
    print(KeyholdVersion.line("keyholdd"), terminator: "")
    exit(0)
}
BrokerMain.run(arguments: arguments)
