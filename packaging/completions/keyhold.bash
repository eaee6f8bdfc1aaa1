# bash completion for keyhold(1): commands and their options. Item names are not completed:
# listing them would need a request to the broker at every <Tab>.
_keyhold() {
    local cur prev words cword
    _init_completion || return
    local commands="put get rotate rm ls state lock status biometry audit secret-service demo help"
    local cmd="" i
    for ((i = 1; i < cword; i++)); do
        case "${words[i]}" in
            --socket) ((i++)) ;;
            -*) ;;
            *) cmd=${words[i]}; break ;;
        esac
    done
    case "$prev" in
        --socket|--allow-exe) _filedir; return ;;
        --kind) COMPREPLY=($(compgen -W "refresh-token password generic" -- "$cur")); return ;;
        --policy|--default-policy)
            COMPREPLY=($(compgen -W "none user-presence biometry-any biometry-current-set device-passcode" -- "$cur")); return ;;
        --label|--reuse|--if-generation|--expires|--reason|--timeout|--since|--until|--item) return ;;
    esac
    local opts=""
    case "$cmd" in
        "") COMPREPLY=($(compgen -W "$commands --socket --help --version" -- "$cur")); return ;;
        put) opts="--label --kind --policy --reuse --allow-exe --update --if-generation --expires" ;;
        get) opts="--reason --no-interaction --json" ;;
        rotate) opts="--reason --timeout --print --no-interaction --expires" ;;
        rm) opts="--reason --no-interaction" ;;
        ls|state) opts="--json" ;;
        audit)
            if [ "$cword" -eq $((i + 1)) ] && [[ "$cur" != -* ]]; then
                COMPREPLY=($(compgen -W "verify export prune" -- "$cur")); return
            fi
            opts="--json --since --item --follow --export --until" ;;
        secret-service) opts="--default-policy --reuse --replace" ;;
        demo) opts="--non-interactive" ;;
        help) COMPREPLY=($(compgen -W "$commands" -- "$cur")); return ;;
    esac
    COMPREPLY=($(compgen -W "$opts --help" -- "$cur"))
}
complete -F _keyhold keyhold
