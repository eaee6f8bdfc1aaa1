#!/bin/sh
# Installs Keyhold's PAM service files (keyhold, keyhold-biometry, keyhold-passcode).
#
#   pam/install.sh [--force] [--dest DIR]
#
# --dest DIR  install into DIR instead of /etc/pam.d (packaging, tests).
# --force     replace a file that exists and differs (the old one is kept as FILE.keyhold-old).
# Without --force, a differing file is never overwritten: the script stops with exit 1 before
# changing anything. Identical files are left alone. Files are installed 0644 root:root.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
dest=/etc/pam.d
force=0
while [ $# -gt 0 ]; do
    case "$1" in
        --force) force=1 ;;
        --dest) [ $# -ge 2 ] || { echo "install.sh: --dest needs a directory" >&2; exit 2; }; dest=$2; shift ;;
        -h|--help) sed -n '2,10s/^# \{0,1\}//p' "$0"; exit 0 ;;
        *) echo "install.sh: unknown argument: $1" >&2; exit 2 ;;
    esac
    shift
done
services="keyhold keyhold-biometry keyhold-passcode"
[ -d "$dest" ] || { echo "install.sh: $dest is not a directory" >&2; exit 1; }

# Check everything first, so a refusal changes nothing.
for s in $services; do
    if [ -e "$dest/$s" ] && ! cmp -s "$here/$s" "$dest/$s" && [ "$force" != 1 ]; then
        echo "install.sh: $dest/$s exists and differs from $here/$s; not overwriting (use --force)" >&2
        exit 1
    fi
done
for s in $services; do
    if [ -e "$dest/$s" ] && cmp -s "$here/$s" "$dest/$s"; then
        echo "unchanged  $dest/$s"
        continue
    fi
    [ -e "$dest/$s" ] && cp -p "$dest/$s" "$dest/$s.keyhold-old"
    tmp="$dest/.$s.keyhold-new"
    cp "$here/$s" "$tmp"
    chmod 0644 "$tmp"
    if [ "$(id -u)" = 0 ]; then chown root:root "$tmp"; fi
    mv -f "$tmp" "$dest/$s"
    echo "installed  $dest/$s"
done
if ! ls /lib/*/security/pam_fprintd.so >/dev/null 2>&1 && ! ls /usr/lib/*/security/pam_fprintd.so >/dev/null 2>&1 \
   && ! [ -e /lib/security/pam_fprintd.so ]; then
    echo "note: pam_fprintd.so not found (apt-get install libpam-fprintd): biometry policies will fail," >&2
    echo "      user-presence will use the password only." >&2
fi
