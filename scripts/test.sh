#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds, runs every test against the real
# components (libsodium, SQLite files, libpam with pam/test stacks, the broker over its
# socket, fprintd with libfprint's virtual reader), then the demo as a smoke test.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
[ "$(id -u)" -eq 0 ] || echo "test: not root: the second-user and fingerprint tests will be skipped" >&2

swift build --build-tests
# Swift Testing runs suites in parallel; each suite that starts fprintd or a broker uses its
# own temporary directories, sockets and bus.
# All tests are Swift Testing; XCTest is off so its empty "Executed 0 tests" never prints.
log=$(mktemp /tmp/keyhold-test.XXXXXX)
trap 'rm -f "$log"' EXIT
swift test --skip-build --disable-xctest 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
[ "$status" -eq 0 ] || exit "$status"
# Guard against a run that executed nothing.
count=$(sed -nE 's/.*Test run with ([0-9]+) tests? .* passed.*/\1/p' "$log" | tail -n 1)
[ -n "$count" ] && [ "$count" -gt 0 ] || { echo "test: no tests ran" >&2; exit 1; }

echo "== demo smoke test"
swift build --product keyhold >/dev/null
.build/debug/keyhold demo --non-interactive

# One plain closing line for the whole run: the Swift tests plus the demo.
echo "keyhold: $((count + 1)) passed, 0 failed"
