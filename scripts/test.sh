#!/usr/bin/env bash
# Installs, builds and runs every test: unit, integration (real processes, network
# namespaces, mpirun) and the bounded fuzz run. Hardware-only tests print SKIPPED.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${SANITIZE:-0}" = 1 ]; then  # SANITIZE=1: the same tests on an ASan+UBSan build
  export BUILD_DIR=${BUILD_DIR:-build-asan}
  ./scripts/build.sh -DBT_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug
else
  ./scripts/build.sh
fi
cd "${BUILD_DIR:-build}"
ctest --output-on-failure -j "$(nproc)" --timeout 300
