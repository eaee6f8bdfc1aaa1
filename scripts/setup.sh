#!/usr/bin/env bash
# Installs what building and testing Keyhold needs on Debian 12, only when it is missing.
# Needs root for apt-get (CI and the dev machines run as root; otherwise it uses sudo).
set -euo pipefail

packages=(
  libsodium-dev libpam0g-dev libsqlite3-dev   # the three C libraries Keyhold links
  libpam-wrapper                              # pam_matrix: the test/demo password module
  fprintd libpam-fprintd                      # fingerprint: the real daemon and PAM module
  dbus dbus-daemon python3-dbusmock python3-dbus  # private bus + polkit stand-in for fprintd tests
  libglib2.0-bin                              # gdbus, used by the fingerprint test harness
  util-linux passwd                           # setsid, setpriv, prlimit; useradd for the second-user tests
  tmux                                        # a real terminal for the prompt tests
  git python3 skopeo                          # credential helper tests: real git over smart HTTP, skopeo credHelpers
  libsystemd-dev libssl-dev                   # sd-bus and libcrypto for the Secret Service agent
  libsecret-tools python3-secretstorage python3-keyring gnome-keyring  # Secret Service clients; benchmark peer
  libtss2-dev libtss2-tcti-tabrmd0            # TPM 2.0 Software Stack (ESAPI; device, swtpm and tabrmd TCTIs): the TPM key protector
  swtpm swtpm-tools tpm2-tools                # a software TPM for the tests; tpm2-tools only to clear/extend it in tests
  dpkg-dev lintian binutils                   # scripts/package.sh (dpkg-shlibdeps, dpkg-gencontrol, strip) and its test
  mmdebstrap systemd-container                # the package booted in Debian 12 under systemd-nspawn (SystemdNspawnTests)
  pass gnupg keepassxc age                    # keyhold import/export tests: real pass, gpg, keepassxc-cli, age
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq "${missing[@]}" >/dev/null
fi

if ! command -v swift >/dev/null 2>&1; then
  for d in /opt/swift/usr/bin /usr/share/swift/usr/bin; do [ -x "$d/swift" ] && export PATH="$d:$PATH"; done
fi
command -v swift >/dev/null 2>&1 || { echo "setup: Swift 6 is not installed (see https://swift.org/install)" >&2; exit 1; }
