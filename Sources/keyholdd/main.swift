import KeyholdBroker

// keyholdd: the broker daemon. Each PAM transaction runs in keyhold-pam-helper, found next
// to this executable (see KeyholdAuth/PAMHelperProcess.swift).
BrokerMain.run(arguments: Array(CommandLine.arguments.dropFirst()))
