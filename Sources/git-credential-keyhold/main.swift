import Glibc
import KeyholdCredentialHelpers

// git-credential(1) helper: `git config --global credential.helper keyhold`.
exit(GitCredentialHelper.main(Array(CommandLine.arguments.dropFirst())))
