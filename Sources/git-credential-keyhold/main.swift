import Glibc
import KeyholdCore
import KeyholdCredentialHelpers

// git-credential(1) helper: `git config --global credential.helper keyhold`.
let arguments = Array(CommandLine.arguments.dropFirst())
let help = """
    usage: git-credential-keyhold [--policy EXPR] [--reuse SECONDS] get|store|erase

    A git credential helper: git keeps passwords and tokens in the Keyhold vault. Set it
    with `git config --global credential.helper keyhold` (or "keyhold --policy
    device-passcode --reuse 60" to gate new credentials); git runs it, not you.

      --policy EXPR      policy of credentials it stores (default none)
      --reuse SECONDS    their reuse window, 0-300 (default 0)
      --version          print the version and exit
    """
if let answer = KeyholdVersion.standardAnswer(arguments, program: "git-credential-keyhold", help: help) {
    print(answer, terminator: "")
    exit(0)
}
exit(GitCredentialHelper.main(arguments))
