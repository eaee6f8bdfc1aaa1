import Glibc
import KeyholdCore
import KeyholdPAMHelper

// keyhold-pam-helper: runs one PAM transaction for keyholdd, which starts it (as root, from
// the directory keyholdd itself runs from) for every authentication and talks to it over
// fd 3 only. Its own small executable, as OpenSSH's sshd-auth is: PAM modules are third-party
// code running as root, and this process maps libpam and the Swift runtime only, never the
// store, SQLite, the TPM stack or a key. Started by anything but keyholdd, it exits at once.
// `--version` and `--help` only print (keyholdd always passes `--pam-helper PID` first).
let help = """
    usage: keyhold-pam-helper --pam-helper BROKER-PID   (started by keyholdd only)

    Runs one PAM transaction for keyholdd over the descriptor keyholdd passes it; started by
    anything else it exits at once. Install it beside keyholdd.
    """
if let answer = KeyholdVersion.standardAnswer(Array(CommandLine.arguments.dropFirst()), program: "keyhold-pam-helper", help: help) {
    print(answer, terminator: "")
    exit(0)
}
PAMHelperProcess.main()
