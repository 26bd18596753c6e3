#!/usr/bin/env bash
# Installs the Debian packages and builds bt-launch into build/ (or $BUILD_DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
build_dir=${BUILD_DIR:-build}
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null  # later -D flags win
cmake --build "$build_dir" -j "$(nproc)"
