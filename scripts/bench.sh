#!/usr/bin/env bash
# Benchmarks against peers in the same run; figures go to docs/PERFORMANCE.md by hand.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh
root=$(mktemp -d /tmp/bt-launch-bench.XXXXXX)
trap 'rm -rf "$root"' EXIT
echo "== PID 1 overhead: bt-launch vs tini vs plain exec"
build/tests/pid1_overhead build/launcher/bt-launch "$(command -v tini)" "$root" "${RUNS:-2000}"
