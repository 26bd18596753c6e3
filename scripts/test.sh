#!/usr/bin/env bash
# Installs, builds and runs every test: unit, integration (real processes, network
# namespaces, mpirun) and the bounded fuzz run. Hardware-only tests print SKIPPED.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh
cd "${BUILD_DIR:-build}"
ctest --output-on-failure -j "$(nproc)" --timeout 300
