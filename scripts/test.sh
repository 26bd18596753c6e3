#!/usr/bin/env bash
# Installs, builds and runs every test: unit, integration (real processes, network
# namespaces, mpirun), the nemesis soak and the bounded fuzz run. Hardware-only tests print
# SKIPPED.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${SANITIZE:-0}" = 1 ]; then  # SANITIZE=1: the same tests on an ASan+UBSan build
  export BUILD_DIR=${BUILD_DIR:-build-asan}
  ./scripts/build.sh -DBT_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug
else
  # One build, the one packagers and users make (Release with Ninja, the README's "Building
  # from source"), with the tests and warnings as errors: every test runs on it, and the
  # Dockerfile's test checks its own build against it instead of compiling everything again.
  export BUILD_DIR=${BUILD_DIR:-build-release}
  ./scripts/build.sh -G Ninja -DCMAKE_BUILD_TYPE=Release -DBT_WERROR=ON
fi
cd "$BUILD_DIR"
ctest --output-on-failure -j "$(nproc)" --timeout 300
