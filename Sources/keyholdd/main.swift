import KeyholdAuth
import KeyholdBroker

// keyholdd: the broker daemon. It also runs, re-executed as `keyholdd --pam-helper`, the
// short-lived helper process that performs one PAM transaction (see KeyholdAuth).
let arguments = Array(CommandLine.arguments.dropFirst())
if arguments.first == "--pam-helper" {
    PAMHelperProcess.main()
}
BrokerMain.run(arguments: arguments)
