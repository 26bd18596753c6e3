#!/usr/bin/env bash
# Installs, builds and runs the demo job: a real data-parallel training (torchrun, gloo,
# two workers per node) on two nodes as two bt-launch processes on this host, with weights
# staged, the dataset seeded into the project cache, checkpoints uploaded and a second job
# resuming from the latest one. See examples/train/demo.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_TARGETS=bt-launch ./scripts/build.sh  # the launcher alone: the tests are test.sh's
exec examples/train/demo.sh build/launcher/bt-launch
