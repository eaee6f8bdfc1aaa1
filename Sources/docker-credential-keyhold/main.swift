import Glibc
import KeyholdCore
import KeyholdCredentialHelpers

// docker-credential-helpers protocol: `"credsStore": "keyhold"` or `"credHelpers": {HOST: "keyhold"}`.
let arguments = Array(CommandLine.arguments.dropFirst())
let help = """
    usage: docker-credential-keyhold store|get|erase|list|version

    A docker credential helper: docker, podman, skopeo and buildah keep registry passwords
    and tokens in the Keyhold vault. Set "credsStore": "keyhold" in ~/.docker/config.json,
    or "credHelpers": {"HOST": "keyhold"} in a containers auth.json.
    """
if let answer = KeyholdVersion.standardAnswer(arguments, program: "docker-credential-keyhold", help: help) {
    print(answer, terminator: "")
    exit(0)
}
// The protocol's own `version` action, with the one version number.
if arguments == ["version"] {
    print("docker-credential-keyhold (Keyhold) \(KeyholdVersion.string)")
    exit(0)
}
exit(DockerCredentialHelper.main(arguments))
