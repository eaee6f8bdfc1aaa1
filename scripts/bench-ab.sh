#!/usr/bin/env bash
# Compares two release builds' concurrent `get` throughput (on demand, never in CI). This
# machine's speed drifts by half within an hour, so single runs compare nothing: the two builds
# run `keyhold-bench --items 1000 --throughput-only` alternately, PAIRS times (A first, then B,
# then A …), and each pair is one comparison made under the same conditions. Printed: every
# pair's gets/s at 1 and 64 clients, 64-client p99 and CPU per get, then the medians and in how
# many pairs B was faster at 64 clients.
#   scripts/bench-ab.sh BUILD_DIR_A BUILD_DIR_B [PAIRS=5]
# A build directory holds keyhold-bench, keyholdd, keyhold and keyhold-pam-helper (copy them
# out of .build/release before changing the code, e.g. into /tmp/ab-before).
set -euo pipefail
A=${1:?usage: bench-ab.sh BUILD_DIR_A BUILD_DIR_B [PAIRS]}; B=${2:?usage: bench-ab.sh BUILD_DIR_A BUILD_DIR_B [PAIRS]}
PAIRS=${3:-5}
for d in "$A" "$B"; do
  for f in keyhold-bench keyholdd keyhold keyhold-pam-helper; do
    [ -x "$d/$f" ] || { echo "bench-ab: $d/$f is missing" >&2; exit 2; }
  done
done
out=$(mktemp); trap 'rm -f "$out"' EXIT

# One run: "gets/s at 1, gets/s at 64, p99 ms at 64, broker µs, client µs" (from its report lines).
one() {
  "$1/keyhold-bench" --items 1000 --throughput-only 2>&1 | awk '
    /get throughput, 1 client:/   { split($0, a, "p50 / p99 "); split(a[2], b, " "); one = b[1] }
    /get throughput, 64 clients:/ { split($0, a, "p50 / p99 "); split(a[2], b, " "); many = b[1]; p99 = b[6] }
    /CPU per get at 64:/          { split($0, a, "threads "); split(a[2], b, " "); broker = b[1]; client = b[3] }
    END { if (many == "") exit 1; printf "%s %s %s %s %s\n", one, many, p99, broker, client }'
}

printf '%-6s %-44s %s\n' pair "A: 1 / 64 clients gets/s, p99, CPU b/c µs" "B: same"
for p in $(seq "$PAIRS"); do
  a=$(one "$A") || { echo "bench-ab: a run of A failed" >&2; exit 1; }
  b=$(one "$B") || { echo "bench-ab: a run of B failed" >&2; exit 1; }
  echo "$a $b" >> "$out"
  read -r a1 a64 ap ab ac <<< "$a"; read -r b1 b64 bp bb bc <<< "$b"
  printf '%-6s %-44s %s\n' "$p" "$a1 / $a64, $ap ms, $ab/$ac" "$b1 / $b64, $bp ms, $bb/$bc"
done
awk -v pairs="$PAIRS" '
  function median(v, n,   i, j, t) {
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
    return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
  }
  { a1[NR] = $1; a64[NR] = $2; ap[NR] = $3; acpu[NR] = $4 + $5
    b1[NR] = $6; b64[NR] = $7; bp[NR] = $8; bcpu[NR] = $9 + $10
    if ($7 > $2) wins++
    ar[NR] = $2 / $1; br[NR] = $7 / $6 }
  END {
    printf "median  A: 64 clients %.0f gets/s (%.1fx 1 client), p99 %.1f ms, CPU %.0f us/get\n", median(a64, NR), median(ar, NR), median(ap, NR), median(acpu, NR)
    printf "median  B: 64 clients %.0f gets/s (%.1fx 1 client), p99 %.1f ms, CPU %.0f us/get\n", median(b64, NR), median(br, NR), median(bp, NR), median(bcpu, NR)
    printf "B faster at 64 clients in %d of %d pairs\n", wins, NR
  }' "$out"
