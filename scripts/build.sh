#!/usr/bin/env bash
# Installs the Debian packages and builds bt-launch into build/ (or $BUILD_DIR): every
# target, or only those in $BUILD_TARGETS (space-separated).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
build_dir=${BUILD_DIR:-build}
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null  # later -D flags win
targets=()
for target in ${BUILD_TARGETS:-}; do targets+=(--target "$target"); done
cmake --build "$build_dir" -j "$(nproc)" "${targets[@]}"
