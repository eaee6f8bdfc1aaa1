#!/usr/bin/env bash
# Builds the Debian package dist/keyhold_VERSION_ARCH.deb from a release build, with Debian's
# tools: dpkg-shlibdeps finds the shared libraries' packages, dpkg-gencontrol writes the
# control file, dpkg-deb builds the archive.
#
#   scripts/package.sh [--no-build] [--out DIR] [--scratch-path DIR]
#
# --no-build  package the release build already in .build (scripts/install.sh --no-build).
# --out DIR   write the .deb into DIR instead of dist/.
# --scratch-path DIR  SwiftPM's build directory (default .build).
#
# KEYHOLD_MAINTAINER="Name <address>" sets the Maintainer field and the changelog's signer.
#
# The version is KeyholdVersion.string in Sources/KeyholdCore/Version.swift, the number every
# program's --version prints. Files are laid out by scripts/install.sh --prefix /usr; the
# packaging's own files (control, maintainer scripts, copyright) are in packaging/debian.
set -euo pipefail
cd "$(dirname "$0")/.."

out=dist
build=()
while [ $# -gt 0 ]; do
    case "$1" in
        --no-build) build+=(--no-build) ;;
        --scratch-path) [ $# -ge 2 ] || { echo "package.sh: --scratch-path needs a directory" >&2; exit 2; }; build+=(--scratch-path "$2"); shift ;;
        --out) [ $# -ge 2 ] || { echo "package.sh: --out needs a directory" >&2; exit 2; }; out=$2; shift ;;
        -h|--help) sed -n '2,16s/^# \{0,1\}//p' "$0"; exit 0 ;;
        *) echo "package.sh: unknown argument: $1" >&2; exit 2 ;;
    esac
    shift
done
for tool in dpkg-deb dpkg-gencontrol dpkg-shlibdeps; do
    command -v "$tool" >/dev/null || { echo "package.sh: $tool is missing (apt-get install dpkg-dev)" >&2; exit 1; }
done

version=$(sed -n 's/^ *public static let string = "\([^"]*\)".*/\1/p' Sources/KeyholdCore/Version.swift)
[ -n "$version" ] || { echo "package.sh: no version in Sources/KeyholdCore/Version.swift" >&2; exit 1; }
arch=$(dpkg --print-architecture)
maintainer=${KEYHOLD_MAINTAINER:-Keyhold developers <keyhold@keyhold.invalid>}

stage=$(mktemp -d /tmp/keyhold-package.XXXXXX)
trap 'rm -rf "$stage"' EXIT
chmod 0755 "$stage"
root=$stage/root      # the package's file tree
src=$stage/src        # a minimal source tree for dpkg-shlibdeps and dpkg-gencontrol
mkdir -p "$root" "$src/debian"

scripts/install.sh "${build[@]}" --prefix /usr --destdir "$root" >/dev/null

# As dh_strip does: symbols and notes out (Swift's metadata lives in its own sections).
for f in "$root"/usr/bin/* "$root"/usr/sbin/*; do
    strip --remove-section=.comment --remove-section=.note "$f"
done
# As dh_compress does: documentation over 4 KiB compressed; the Debian changelog and copyright.
find "$root/usr/share/doc/keyhold" -type f -size +4k -exec gzip -9n {} +
if date=$(git log -1 --format=%cD 2>/dev/null) && [ -n "$date" ]; then :; else date=$(date -R); fi
cat > "$src/debian/changelog" <<EOF
keyhold ($version) unstable; urgency=medium

  * Keyhold $version, packaged from source by scripts/package.sh.

 -- $maintainer  $date
EOF
gzip -9n < "$src/debian/changelog" > "$root/usr/share/doc/keyhold/changelog.gz"
install -m 0644 packaging/debian/copyright "$root/usr/share/doc/keyhold/copyright"
install -D -m 0644 packaging/debian/lintian-overrides "$root/usr/share/lintian/overrides/keyhold"

install -d -m 0755 "$root/DEBIAN"
for s in postinst prerm postrm; do install -m 0755 "packaging/debian/$s" "$root/DEBIAN/$s"; done
# dpkg never replaces a PAM file the administrator changed; it asks.
(cd "$root" && find etc -type f | sed 's|^|/|' | sort) > "$root/DEBIAN/conffiles"
chmod 0644 "$root/DEBIAN/conffiles"
# As dh_md5sums does: every file but the conffiles, for debsums and dpkg --verify.
(cd "$root" && find . -path ./DEBIAN -prune -o -path ./etc -prune -o -type f -printf '%P\0' | sort -z | xargs -0 md5sum) > "$root/DEBIAN/md5sums"
chmod 0644 "$root/DEBIAN/md5sums"

cp packaging/debian/control "$src/debian/control"
# deb-systemd-helper and deb-systemd-invoke, as ${misc:Depends} names them for debhelper.
echo 'misc:Depends=init-system-helpers (>= 1.54~)' > "$src/debian/substvars"
# keyhold and the credential helpers are static executables: nothing to resolve.
(cd "$src" && dpkg-shlibdeps -Tdebian/substvars \
    "$root/usr/sbin/keyholdd" "$root/usr/sbin/keyhold-pam-helper" "$root/usr/bin/keyhold-secret-service")
(cd "$src" && dpkg-gencontrol -v"$version" -DMaintainer="$maintainer" -P"$root" -Tdebian/substvars)

mkdir -p "$out"
deb="$out/keyhold_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
echo "$deb"
