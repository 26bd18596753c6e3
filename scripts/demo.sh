#!/usr/bin/env bash
# Installs, builds and runs the demo job from examples/ with every path under a
# temporary root, so nothing outside it is touched.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh
root=$(mktemp -d /tmp/bt-launch-demo.XXXXXX)
echo "demo root: $root"
exec build/launcher/bt-launch run --config examples/single-node.json --root "$root"
