#!/usr/bin/env bash
# Hot spares against a replaced node: see scripts/bench_spare.py (a table, then one JSON line).
#   RUNS=1 NODES=4 PART_MIB=1024 SCHEDULER_DELAY_S=30 BUILD_DIR=build ./scripts/bench_spare.sh
set -euo pipefail
exec python3 "$(dirname "$0")/bench_spare.py" "$@"
