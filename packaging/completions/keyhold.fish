# fish completion for keyhold(1): commands and their options (item names are not completed).
set -l commands put get rotate rm ls state lock status biometry audit secret-service demo help
set -l policies none user-presence biometry-any biometry-current-set device-passcode
complete -c keyhold -f
complete -c keyhold -n "not __fish_seen_subcommand_from $commands" -l socket -r -F -d 'broker socket'
complete -c keyhold -n "not __fish_seen_subcommand_from $commands" -l version -d 'print the version'
complete -c keyhold -l help -d 'show help'
complete -c keyhold -n "not __fish_seen_subcommand_from $commands" -a put -d 'store a secret read from standard input'
complete -c keyhold -n "not __fish_seen_subcommand_from $commands" -a get -d "write an item's secret to standard output"
complete -c keyhold -n "not __fish_seen_subcommand_from $commands" -a rotate -d 'replace a secret under a lease'
complete -c keyhold -n "not __fish_seen_subcommand_from $commands" -a rm -d 'remove an item'
complete -c keyhold -n "not __fish_seen_subcommand_from $commands" -a ls -d "list your items' metadata"
complete -c keyhold -n "not __fish_seen_subcommand_from $commands" -a state -d 'print whether an item is available'
complete -c keyhold -n "not __fish_seen_subcommand_from $commands" -a lock -d 'end your reuse windows'
complete -c keyhold -n "not __fish_seen_subcommand_from $commands" -a status -d 'show how the vault is protected'
complete -c keyhold -n "not __fish_seen_subcommand_from $commands" -a biometry -d 'show the fingerprint reader'
complete -c keyhold -n "not __fish_seen_subcommand_from $commands" -a audit -d 'show, verify, export or prune audit entries'
complete -c keyhold -n "not __fish_seen_subcommand_from $commands" -a secret-service -d 'run the Secret Service agent'
complete -c keyhold -n "not __fish_seen_subcommand_from $commands" -a demo -d 'try Keyhold on a temporary vault'
complete -c keyhold -n "not __fish_seen_subcommand_from $commands" -a help -d "show a command's help"
complete -c keyhold -n "__fish_seen_subcommand_from help" -a "$commands"
complete -c keyhold -n "__fish_seen_subcommand_from put" -l label -x -d 'label shown by ls'
complete -c keyhold -n "__fish_seen_subcommand_from put" -l kind -x -a 'refresh-token password generic'
complete -c keyhold -n "__fish_seen_subcommand_from put" -l policy -x -a "$policies"
complete -c keyhold -n "__fish_seen_subcommand_from put secret-service" -l reuse -x -d 'reuse window in seconds'
complete -c keyhold -n "__fish_seen_subcommand_from put" -l allow-exe -r -F -d 'only this program may read'
complete -c keyhold -n "__fish_seen_subcommand_from put" -l update -d 'replace an existing item'
complete -c keyhold -n "__fish_seen_subcommand_from put" -l if-generation -x
complete -c keyhold -n "__fish_seen_subcommand_from put rotate" -l expires -x -d 'expiry time'
complete -c keyhold -n "__fish_seen_subcommand_from get rotate rm" -l reason -x -d 'why (audited)'
complete -c keyhold -n "__fish_seen_subcommand_from get rotate rm" -l no-interaction -d 'never prompt'
complete -c keyhold -n "__fish_seen_subcommand_from get ls state audit" -l json
complete -c keyhold -n "__fish_seen_subcommand_from rotate" -l timeout -x
complete -c keyhold -n "__fish_seen_subcommand_from rotate" -l print -d 'print the new secret'
complete -c keyhold -n "__fish_seen_subcommand_from audit" -a 'verify export prune'
complete -c keyhold -n "__fish_seen_subcommand_from audit" -l since -x
complete -c keyhold -n "__fish_seen_subcommand_from audit" -l item -x
complete -c keyhold -n "__fish_seen_subcommand_from audit" -l follow
complete -c keyhold -n "__fish_seen_subcommand_from audit" -l export -r -F
complete -c keyhold -n "__fish_seen_subcommand_from audit" -l until -x
complete -c keyhold -n "__fish_seen_subcommand_from secret-service" -l default-policy -x -a "$policies"
complete -c keyhold -n "__fish_seen_subcommand_from secret-service" -l replace
complete -c keyhold -n "__fish_seen_subcommand_from demo" -l non-interactive
