#!/usr/bin/env bash
# Installs Keyhold from a source build: the same files as the Debian package
# (scripts/package.sh stages the package with this script), for systems without dpkg.
#
#   scripts/install.sh [--prefix DIR] [--destdir DIR] [--no-build] [--scratch-path DIR]
#
# --prefix DIR   where programs, man pages, completions and docs go (default /usr/local).
#                The units and the D-Bus activation file are rewritten to name programs there.
# --destdir DIR  stage everything under DIR instead of / (packaging); nothing is enabled.
# --no-build     use the release build already in .build instead of building it.
# --scratch-path DIR  SwiftPM's build directory (default .build; the package test uses its
#                own, since `swift test` may hold .build's lock while it runs).
#
# Builds every program in release mode with the Swift runtime linked in statically
# (`--static-swift-stdlib`), so they run without a Swift toolchain. PAM service files go to
# /etc/pam.d through pam/install.sh, which never replaces a file that differs. Without
# --destdir, on a machine running systemd, keyholdd.service is enabled and started.
set -euo pipefail
cd "$(dirname "$0")/.."

prefix=/usr/local
destdir=""
build=1
# Relocations resolved and made read-only at start (full RELRO), as Debian's hardening does.
swiftflags=(-c release --static-swift-stdlib -Xlinker -z -Xlinker relro -Xlinker -z -Xlinker now)
while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) [ $# -ge 2 ] || { echo "install.sh: --prefix needs a directory" >&2; exit 2; }; prefix=$2; shift ;;
        --destdir) [ $# -ge 2 ] || { echo "install.sh: --destdir needs a directory" >&2; exit 2; }; destdir=$2; shift ;;
        --no-build) build=0 ;;
        --scratch-path) [ $# -ge 2 ] || { echo "install.sh: --scratch-path needs a directory" >&2; exit 2; }; swiftflags+=(--scratch-path "$2"); shift ;;
        -h|--help) sed -n '2,18s/^# \{0,1\}//p' "$0"; exit 0 ;;
        *) echo "install.sh: unknown argument: $1" >&2; exit 2 ;;
    esac
    shift
done
case "$prefix" in /*) ;; *) echo "install.sh: --prefix must be an absolute path" >&2; exit 2 ;; esac

# keyhold-pam-helper must lie beside keyholdd: the broker starts it from its own directory.
system_programs=(keyholdd keyhold-pam-helper)
user_programs=(keyhold git-credential-keyhold docker-credential-keyhold keyhold-secret-service)
if [ "$build" = 1 ]; then
    for p in "${system_programs[@]}" "${user_programs[@]}"; do
        swift build "${swiftflags[@]}" --product "$p"
    done
fi
bin=$(swift build "${swiftflags[@]}" --show-bin-path)
for p in "${system_programs[@]}" "${user_programs[@]}"; do
    [ -x "$bin/$p" ] || { echo "install.sh: $bin/$p is missing (run without --no-build)" >&2; exit 1; }
done

# Debian keeps system units in /lib/systemd/system (bookworm); elsewhere under the prefix,
# which systemd also searches (/usr/local/lib/systemd/system).
if [ "$prefix" = /usr ]; then unitdir=/lib/systemd/system; zshdir=$prefix/share/zsh/vendor-completions
else unitdir=$prefix/lib/systemd/system; zshdir=$prefix/share/zsh/site-functions; fi
root=${destdir%/}
rewrite() { sed "s|/usr/local/|$prefix/|g" "$1"; }   # the shipped files name /usr/local

install -d -m 0755 "$root$prefix/bin" "$root$prefix/sbin"
for p in "${system_programs[@]}"; do install -m 0755 "$bin/$p" "$root$prefix/sbin/$p"; done
for p in "${user_programs[@]}"; do install -m 0755 "$bin/$p" "$root$prefix/bin/$p"; done

install -d -m 0755 "$root$unitdir" "$root$prefix/lib/systemd/user" "$root$prefix/share/dbus-1/services"
rewrite systemd/keyholdd.service > "$root$unitdir/keyholdd.service"
rewrite systemd/keyhold-secret-service.service > "$root$prefix/lib/systemd/user/keyhold-secret-service.service"
# Not named org.freedesktop.secrets.service: gnome-keyring ships that file name.
rewrite dbus/org.freedesktop.secrets.service > "$root$prefix/share/dbus-1/services/org.freedesktop.secrets.keyhold.service"
chmod 0644 "$root$unitdir/keyholdd.service" "$root$prefix/lib/systemd/user/keyhold-secret-service.service" \
    "$root$prefix/share/dbus-1/services/org.freedesktop.secrets.keyhold.service"

install -d -m 0755 "$root$prefix/share/man/man1" "$root$prefix/share/man/man8"
for page in packaging/man/*.[18]; do
    section=${page##*.}
    gzip -9n < "$page" > "$root$prefix/share/man/man$section/$(basename "$page").gz"
    chmod 0644 "$root$prefix/share/man/man$section/$(basename "$page").gz"
done

install -D -m 0644 packaging/completions/keyhold.bash "$root$prefix/share/bash-completion/completions/keyhold"
install -D -m 0644 packaging/completions/_keyhold "$root$zshdir/_keyhold"
install -D -m 0644 packaging/completions/keyhold.fish "$root$prefix/share/fish/vendor_completions.d/keyhold.fish"

install -d -m 0755 "$root$prefix/share/doc/keyhold"
install -m 0644 README.md SECURITY.md docs/*.md "$root$prefix/share/doc/keyhold/"
install -m 0644 pam/README.md "$root$prefix/share/doc/keyhold/PAM.md"

install -d -m 0755 "$root/etc/pam.d"
pam/install.sh --dest "$root/etc/pam.d"

if [ -z "$destdir" ] && [ -d /run/systemd/system ]; then
    systemctl daemon-reload
    systemctl enable --now keyholdd.service
    echo "keyholdd.service enabled and started; 'systemctl status keyholdd' shows it."
fi
