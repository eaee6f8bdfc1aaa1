#!/usr/bin/env bash
# The demo: a real broker on a temporary vault, put -> PAM-gated get -> ls -> audit.
# From a terminal it asks for the demo password; without one it answers through askpass.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
swift build -c release --product keyhold >/dev/null
swift build -c release --product keyholdd >/dev/null
swift build -c release --product keyhold-pam-helper >/dev/null
if [ -t 0 ] && [ -z "${CI:-}" ]; then
  exec .build/release/keyhold demo "$@"
else
  exec .build/release/keyhold demo --non-interactive "$@"
fi
