#!/usr/bin/env bash
# Installs, builds and runs the demo: a 4-node job (examples/multi-node.json) as four
# bt-launch processes on this host, rendezvousing on loopback, with every path under a
# temporary root. Each node's output is prefixed with its rank.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh
root=$(mktemp -d /tmp/bt-launch-demo.XXXXXX)
nodes=4
export BT_RENDEZVOUS_TOKEN=${BT_RENDEZVOUS_TOKEN:-demo-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')}
echo "demo root: $root"
pids=()
for rank in $(seq 0 $((nodes - 1))); do
  build/launcher/bt-launch run --config examples/multi-node.json --root "$root" \
    --node-rank "$rank" --node-count "$nodes" --leader-addr 127.0.0.1 > >(sed -u "s/^/[node $rank] /") 2>&1 &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
echo "checkpoints written:"
find "$root" -path '*/mnt/ckpts/checkpoint-*' -maxdepth 5 -type d | sort
exit $status
