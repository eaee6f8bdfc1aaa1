#!/usr/bin/env bash
# The benchmark (on demand, never in CI): a release broker on a temporary vault, measured
# through the client library and through the CLI as separate processes.
#   scripts/bench.sh [--items N] [--audit-entries N]    (defaults 100000 and 1000000)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
swift build -c release >/dev/null
exec .build/release/keyhold-bench "$@"
