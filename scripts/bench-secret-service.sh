#!/usr/bin/env bash
# Secret Service benchmark, on demand (never in CI): `secret-tool lookup` through Keyhold's agent
# and through gnome-keyring, side by side in the same run, each on its own private session bus,
# at each item count of SIZES (default 1,000 then 10,000), printed as p50s and a ratio. Needs
# root (it starts keyholdd and a throwaway user). Then, against the same vaults (the last size),
# `git credential fill` through git-credential-keyhold beside git's `store` helper and
# git-credential-libsecret (built from git's contrib source) on gnome-keyring, LOOKUPS each, as
# p50s and ratios; GIT_FILL=0 skips that part. It installs libsecret-1-dev and pkg-config
# with apt-get when they are missing (to build git-credential-libsecret).
#   scripts/bench-secret-service.sh [SIZES="1000 10000"] [LOOKUPS=200] [BUILD_DIR=.build/release]
set -euo pipefail
SIZES=${1:-1000 10000}; L=${2:-200}; BIN=$(cd "${3:-.build/release}" && pwd)
REPO=$(cd "$(dirname "$0")/.." && pwd)
T=$(mktemp -d /tmp/khssb-XXXXXX); chmod 755 "$T"
U=khb$$; useradd -M -s /usr/sbin/nologin "$U"
pids=()
# Everything the throwaway user runs goes too (bus daemons and keyrings started under runuser
# outlive the wrapper pids), or it would hold this script's output open after it ends.
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; pkill -9 -u "$U" 2>/dev/null || true
            userdel "$U" 2>/dev/null || true; rm -rf "$T"; }
trap cleanup EXIT
as_user() { setpriv --reuid="$U" --regid="$U" --init-groups -- env -i PATH=/usr/bin:/bin HOME="$T/$1" \
            XDG_RUNTIME_DIR="$T/$1" DBUS_SESSION_BUS_ADDRESS="unix:path=$T/$1/bus" "${@:2}"; }
bus() {  # a private session bus for $1 (keyhold | gnome)
  mkdir -p "$T/$1"; chown "$U" "$T/$1"
  cat > "$T/$1.conf" <<CONF
<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN" "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig><type>session</type><listen>unix:path=$T/$1/bus</listen>
<policy context="default"><allow send_destination="*" eavesdrop="true"/><allow eavesdrop="true"/><allow own="*"/></policy></busconfig>
CONF
  as_user "$1" dbus-daemon --config-file="$T/$1.conf" --nofork --nopidfile & pids+=($!)
  for _ in $(seq 100); do [ -S "$T/$1/bus" ] && break; sleep 0.05; done
}

mkdir -m 700 "$T/state"; echo "$U:pw:keyhold-passcode" > "$T/passdb"; chmod 600 "$T/passdb"
start_broker() {
  rm -f "$T/k.sock"
  PAM_MATRIX_PASSWD="$T/passdb" "$BIN/keyholdd" --state-dir "$T/state" --socket "$T/k.sock" --pam-dir "$REPO/pam/test" 2>>"$T/broker.log" & kh=$!; pids+=($kh)
  for _ in $(seq 100); do [ -S "$T/k.sock" ] && break; sleep 0.05; done
}
start_broker
bus keyhold; as_user keyhold "$BIN/keyhold-secret-service" --socket "$T/k.sock" 2>"$T/agent.log" & pids+=($!)
bus gnome
sleep 1

# gnome-keyring rewrites its whole keyring file on every CreateItem (quadratic: a 10,000-item
# fill through D-Bus did not finish), so its items are written as the daemon's own unencrypted
# textual keyring format (gkm-secret-textual.c) and the daemon is restarted on it per size.
# Unencrypted is the fastest gnome-keyring can be (no unlock, no decryption): a lower bound.
gk_fill() {  # $1 = item count
  mkdir -p "$T/gnome/.local/share/keyrings"
  echo -n login > "$T/gnome/.local/share/keyrings/default"
  awk -v n="$1" 'BEGIN {
    print "[keyring]\ndisplay-name=login\nctime=0\nmtime=0\nlock-on-idle=false\nlock-after=false\n"
    for (i = 1; i <= n; i++) {
      printf "[%d]\nitem-type=0\ndisplay-name=bench\nsecret=secret-%d\nmtime=0\nctime=0\n\n", i, i
      printf "[%d:attribute0]\nname=service\ntype=string\nvalue=bench\n\n", i
      printf "[%d:attribute1]\nname=account\ntype=string\nvalue=acct-%d\n\n", i, i
    }
  }' > "$T/gnome/.local/share/keyrings/login.keyring"
  chown -R "$U" "$T/gnome/.local"
  [ -n "${gk:-}" ] && { kill "$gk" 2>/dev/null || true; wait "$gk" 2>/dev/null || true; }
  as_user gnome gnome-keyring-daemon --foreground --components=secrets >>"$T/gk.log" 2>&1 & gk=$!; pids+=($gk)
  for _ in $(seq 600); do  # until it answers for the last item (it loads the file at start)
    [ "$(as_user gnome secret-tool lookup service bench account "acct-$1" 2>/dev/null)" = "secret-$1" ] && return
    sleep 0.1
  done
  echo "gnome-keyring did not load $1 items" >&2; exit 1
}

measure() {  # $1 = bus dir, $2 = item count; prints per-lookup seconds, checks each secret
  for _ in $(seq "$L"); do
    i=$(( (RANDOM * 32768 + RANDOM) % $2 + 1 ))
    s=$(date +%s.%N); out=$(as_user "$1" secret-tool lookup service bench account "acct-$i"); e=$(date +%s.%N)
    [ "$out" = "secret-$i" ] || { echo "wrong secret from $1 for acct-$i: '$out'" >&2; exit 1; }
    echo "$s $e" | awk '{printf "%.6f\n", $2 - $1}'
  done
}
stats() { sort -n | awk '{a[NR]=$1} END {printf "%.1f %.1f\n", a[int(NR*0.5)+1]*1000, a[int(NR*0.95)]*1000}'; }

have=0; results=()
for N in $SIZES; do
  echo "populating $N items in each (Keyhold into its store, gnome-keyring from its keyring file)..."
  # Straight into the store with the broker stopped: through it, the user's audit budget allows
  # a few puts a second after a burst of about 500 (AuditBudget). The same rows and tags as
  # `keyhold put bench acct-N`; one CLI put below checks the path.
  kill "$kh"; wait "$kh" 2>/dev/null || true
  "$BIN/keyhold-bench" --fill-state "$T/state" --owner "$(id -u "$U")" --from $((have + 1)) --to $((N - 1))
  start_broker
  printf "secret-$N" | setpriv --reuid="$U" --regid="$U" --init-groups -- "$BIN/keyhold" --socket "$T/k.sock" put bench "acct-$N" >/dev/null
  have=$N
  gk_fill "$N"
  read -r k50 k95 < <(measure keyhold "$N" | stats)
  read -r g50 g95 < <(measure gnome "$N" | stats)
  results+=("$N $k50 $k95 $g50 $g95")
done
printf "%-28s %22s %22s %8s\n" "secret-tool lookup ($L each)" "Keyhold p50 (p95) ms" "gnome-keyring p50 (p95)" "ratio"
for r in "${results[@]}"; do
  set -- $r
  awk -v n="$1" -v k="$2" -v k95="$3" -v g="$4" -v g95="$5" 'BEGIN {
    printf "%-28s %14.1f (%5.1f) %15.1f (%5.1f) %8.2f\n", n " items", k, k95, g, g95, k / g }'
done

[ "${GIT_FILL:-1}" = 0 ] && exit 0

# `git credential fill` through each helper, in the same run, against the vaults as the last size
# left them (Keyhold's store and gnome-keyring's login keyring hold that many items besides it).
# Each helper gets its own HOME with `[credential] helper = ...`; the throwaway user approves one
# credential, then python3 times LOOKUPS whole `git credential fill` processes (git starts the
# helper as it does for a push), checking every fill returns the password.
cat > "$T/gitfill.py" <<'PY'
import subprocess, sys, time
n = int(sys.argv[1])
desc = b"protocol=https\nhost=bench.example\nusername=alice\n\n"
def fill():
    return subprocess.run(["git", "credential", "fill"], input=desc, capture_output=True, timeout=30)
try:
    subprocess.run(["git", "credential", "approve"], timeout=30, capture_output=True,
                   input=b"protocol=https\nhost=bench.example\nusername=alice\npassword=bench-pw\n\n")
    r = fill()  # git ignores a helper's failure to store: this is the check that it stored
    if b"password=bench-pw\n" not in r.stdout:
        sys.exit("first fill returned no password=bench-pw: " + r.stderr.decode(errors="replace").strip()[-200:])
    for _ in range(n):
        t0 = time.perf_counter(); r = fill(); t = time.perf_counter() - t0
        if b"password=bench-pw\n" not in r.stdout:
            sys.exit("a fill returned no password=bench-pw: " + r.stderr.decode(errors="replace").strip()[-200:])
        print("%.6f" % t)
except subprocess.TimeoutExpired as e:
    sys.exit("timed out: %s" % " ".join(e.cmd))
PY
git_fill() {  # $1 = name, $2 = helper, rest = extra environment; per-fill seconds, or fails with why on stderr
  local h="$T/git-$1"; mkdir -p "$h"; printf '[credential]\n\thelper = %s\n' "$2" > "$h/.gitconfig"; chown -R "$U" "$h"
  setpriv --reuid="$U" --regid="$U" --init-groups -- env -i PATH="$BIN:/usr/bin:/bin" HOME="$h" XDG_RUNTIME_DIR="$h" \
    GIT_CONFIG_NOSYSTEM=1 GIT_TERMINAL_PROMPT=0 "${@:3}" python3 "$T/gitfill.py" "$L"
}

# git-credential-libsecret: Debian ships it only as source; built here, with libsecret-1-dev and
# pkg-config installed first if missing.
LS_SRC=/usr/share/doc/git/contrib/credential/libsecret/git-credential-libsecret.c
ls_why=""
if [ ! -f "$LS_SRC" ]; then ls_why="no source at $LS_SRC"
else
  if ! command -v pkg-config >/dev/null || ! pkg-config --exists libsecret-1 glib-2.0; then
    echo "installing libsecret-1-dev pkg-config to build git-credential-libsecret..."
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libsecret-1-dev pkg-config >"$T/apt.log" 2>&1 ||
      { DEBIAN_FRONTEND=noninteractive apt-get update -qq >>"$T/apt.log" 2>&1 &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libsecret-1-dev pkg-config >>"$T/apt.log" 2>&1; } ||
      ls_why="apt-get install libsecret-1-dev pkg-config failed: $(tail -n 1 "$T/apt.log")"
  fi
  [ -z "$ls_why" ] && { cc -O2 -o "$T/git-credential-libsecret" "$LS_SRC" $(pkg-config --cflags --libs libsecret-1 glib-2.0) >"$T/cc.log" 2>&1 ||
    ls_why="build failed: $(grep -m 1 -i error "$T/cc.log" || tail -n 1 "$T/cc.log")"; }
fi

# gnome-keyring: libsecret's CreateItem goes to the `default` alias, which gk_fill points at its
# `login` keyring; that keyring is unencrypted, so it is unlocked and takes the item without a
# prompt (no unlock or collection creation is needed; this run's libsecret row checks it: a
# CreateItem that failed would make the first fill come back without the password).
names=(); rows=()
for h in keyhold store libsecret; do
  case $h in
    keyhold)   n=git-credential-keyhold; args=(keyhold KEYHOLD_SOCKET="$T/k.sock") ;;
    store)     n="git store (plaintext file)"; args=("store --file $T/git-store/git-credentials") ;;
    libsecret) n=git-credential-libsecret; args=("$T/git-credential-libsecret" DBUS_SESSION_BUS_ADDRESS="unix:path=$T/gnome/bus")
               [ -n "$ls_why" ] && { names+=("$n"); rows+=("not measured ($ls_why)"); continue; } ;;
  esac
  if out=$(git_fill "$h" "${args[@]}" 2>"$T/git-$h.err"); then
    names+=("$n"); rows+=("$(stats <<<"$out")")
  else
    names+=("$n"); rows+=("failed ($(tail -n 1 "$T/git-$h.err"))")
  fi
done
printf "%-32s %22s %12s\n" "git credential fill ($L each)" "p50 (p95) ms" "keyhold/this"
k50=""; case ${rows[0]} in [0-9]*) k50=${rows[0]%% *} ;; esac
for i in "${!names[@]}"; do
  case ${rows[$i]} in
    [0-9]*) awk -v n="${names[$i]}" -v r="${rows[$i]}" -v k="$k50" -v i="$i" 'BEGIN {
              split(r, p, " "); printf "%-32s %14.1f (%5.1f)", n, p[1], p[2]
              if (i > 0 && k != "") printf " %12.2f", k / p[1]
              printf "\n" }' ;;
    *) echo "${names[$i]}: ${rows[$i]}" ;;
  esac
done
