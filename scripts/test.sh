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
swift test --skip-build 2>&1 | tee /tmp/keyhold-test.log
status=${PIPESTATUS[0]}
[ "$status" -eq 0 ] || exit "$status"
# Guard against a run that executed nothing.
grep -Eq "Test run with [1-9][0-9]* tests? .*passed" /tmp/keyhold-test.log || { echo "test: no tests ran" >&2; exit 1; }

echo "== demo smoke test"
swift build --product keyhold >/dev/null
.build/debug/keyhold demo --non-interactive
