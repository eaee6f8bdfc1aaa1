#!/usr/bin/env bash
# Secret Service benchmark, on demand (never in CI): `secret-tool lookup` through Keyhold's agent
# and through gnome-keyring, side by side in the same run, each on its own private session bus
# with N items, printed as a ratio. Needs root (it starts keyholdd and a throwaway user).
#   scripts/bench-secret-service.sh [ITEMS=10000] [LOOKUPS=200] [BUILD_DIR=.build/release]
set -euo pipefail
N=${1:-10000}; L=${2:-200}; BIN=$(cd "${3:-.build/release}" && pwd)
REPO=$(cd "$(dirname "$0")/.." && pwd)
T=$(mktemp -d /tmp/khssb-XXXXXX); chmod 755 "$T"
U=khb$$; useradd -M -s /usr/sbin/nologin "$U"
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; userdel "$U" 2>/dev/null || true; rm -rf "$T"; }
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
PAM_MATRIX_PASSWD="$T/passdb" "$BIN/keyholdd" --state-dir "$T/state" --socket "$T/k.sock" --pam-dir "$REPO/pam/test" 2>"$T/broker.log" & pids+=($!)
for _ in $(seq 100); do [ -S "$T/k.sock" ] && break; sleep 0.05; done
bus keyhold; as_user keyhold "$BIN/keyhold-secret-service" --socket "$T/k.sock" 2>"$T/agent.log" & pids+=($!)
bus gnome; echo -n pw | as_user gnome gnome-keyring-daemon --foreground --unlock --components=secrets >"$T/gk.log" 2>&1 & pids+=($!)
sleep 1

echo "populating $N items in each (Keyhold through the CLI, gnome-keyring through python secretstorage)..."
seq 1 "$N" | xargs -P 4 -I{} sh -c "printf 'secret-{}' | setpriv --reuid=$U --regid=$U --init-groups -- '$BIN/keyhold' --socket '$T/k.sock' put bench acct-{} >/dev/null"
cat > "$T/fill.py" <<'PY'
import sys, secretstorage
c = secretstorage.get_default_collection(secretstorage.dbus_init())
for i in range(1, int(sys.argv[1]) + 1):
    c.create_item("bench", {"service": "bench", "account": "acct-%d" % i}, b"secret-%d" % i, replace=True)
PY
chmod 644 "$T/fill.py"; as_user gnome /usr/bin/python3 "$T/fill.py" "$N"

measure() {  # $1 = bus dir; prints per-lookup seconds, checks each secret
  for _ in $(seq "$L"); do
    i=$(( (RANDOM * 32768 + RANDOM) % N + 1 ))
    s=$(date +%s.%N); out=$(as_user "$1" secret-tool lookup service bench account "acct-$i"); e=$(date +%s.%N)
    [ "$out" = "secret-$i" ] || { echo "wrong secret from $1 for acct-$i: '$out'" >&2; exit 1; }
    echo "$s $e" | awk '{printf "%.6f\n", $2 - $1}'
  done
}
stats() { sort -n | awk '{a[NR]=$1} END {printf "%.1f %.1f\n", a[int(NR*0.5)+1]*1000, a[int(NR*0.95)]*1000}'; }
read -r k50 k95 < <(measure keyhold | stats)
read -r g50 g95 < <(measure gnome | stats)
printf "%-40s %12s %12s\n" "secret-tool lookup, $N items, $L lookups" "median ms" "p95 ms"
printf "%-40s %12s %12s\n" "Keyhold (agent -> keyholdd)" "$k50" "$k95"
printf "%-40s %12s %12s\n" "gnome-keyring" "$g50" "$g95"
awk -v k="$k50" -v g="$g50" 'BEGIN {printf "ratio Keyhold / gnome-keyring (median): %.2f\n", k / g}'
