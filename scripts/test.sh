#!/usr/bin/env bash
# Installs, builds and runs every test: unit, integration (real processes, network
# namespaces, mpirun) and the bounded fuzz run. Hardware-only tests print SKIPPED.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${SANITIZE:-0}" = 1 ]; then  # SANITIZE=1: the same tests on an ASan+UBSan build
  export BUILD_DIR=${BUILD_DIR:-build-asan}
  ./scripts/build.sh -DBT_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug
else
  ./scripts/build.sh -DBT_WERROR=ON
  # What packagers and users build: Release with Ninja. Its unit tests run too, so that
  # generator- and optimiser-specific breakage shows up here first.
  cmake -S . -B build-release -G Ninja -DCMAKE_BUILD_TYPE=Release -DBT_WERROR=ON >/dev/null
  cmake --build build-release
  for unit_tests in env_tests rendezvous_tests storage_tests checkpoint_tests launcher_unit_tests; do
    timeout 600 build-release/tests/$unit_tests --gtest_brief=1  # bounded: a hung test fails, not CI's clock
  done
fi
cd "${BUILD_DIR:-build}"
ctest --output-on-failure -j "$(nproc)" --timeout 300
