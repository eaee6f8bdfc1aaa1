import Glibc
import KeyholdCredentialHelpers

// docker-credential-helpers protocol: `"credsStore": "keyhold"` or `"credHelpers": {HOST: "keyhold"}`.
exit(DockerCredentialHelper.main(Array(CommandLine.arguments.dropFirst())))
