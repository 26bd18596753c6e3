#!/usr/bin/env bash
# N nodes starting a job together: `bt-launch bench rendezvous` (what `run` does before its
# first command, every node with the 8-rail InfiniBand fixture's inventory) against the
# same run shape on torch's TCPStore (Debian's python3-torch), and the protocol shape too,
# in one run; prints the tables, then one JSON line with the ratios at PEER_NODES.
#   NODES="1024 16384" PEER_NODES=1024 RUNS=3 BUILD_DIR=build BENCH_ARGS=--protocol-only
set -euo pipefail
cd "$(dirname "$0")/.."
binary=${BUILD_DIR:-build}/launcher/bt-launch
[ -x "$binary" ] || ./scripts/build.sh >/dev/null
runs=${RUNS:-3}
sysfs_root=${SYSFS_ROOT:-tests/fixtures/fabric/ib8-ndr-a/sys}
# shellcheck disable=SC2206  # BENCH_ARGS is a list of options
bench=("$binary" bench rendezvous --sysfs-root "$sysfs_root" ${BENCH_ARGS:-})
peer_nodes=${PEER_NODES:-1024}
work=$(mktemp -d /tmp/bt-bench-rendezvous.XXXXXX)
trap 'rm -rf "$work"' EXIT

for nodes in ${NODES:-1024 16384}; do
  echo "== bt-launch bench rendezvous --nodes $nodes ${BENCH_ARGS:-}"
  "${bench[@]}" --nodes "$nodes" --runs "$runs" 2>/dev/null | tee "$work/bt-$nodes"
done
[ -f "$work/bt-$peer_nodes" ] || "${bench[@]}" --nodes "$peer_nodes" --runs "$runs" 2>/dev/null > "$work/bt-$peer_nodes"
for shape in run protocol; do
  echo "== torch TCPStore, $peer_nodes nodes, one client thread each: the $shape shape"
  /usr/bin/python3 tests/bench/tcpstore_rendezvous.py "$peer_nodes" "$runs" "$shape" | tee "$work/torch-$shape"
done
# speedup: against the peer doing the same work as bt-launch's bench (the run shape unless
# BENCH_ARGS=--protocol-only); speedup_vs_protocol_peer: against the peer's protocol shape.
python3 - "$work/bt-$peer_nodes" "$work/torch-run" "$work/torch-protocol" <<'PY'
import json, sys
last = lambda path: json.loads(open(path).read().splitlines()[-1])
ours, run_peer, protocol_peer = (last(path) for path in sys.argv[1:])
shape = ours.get("shape", "protocol")
peer = run_peer if shape == "run" else protocol_peer
print(json.dumps({"nodes": ours["nodes"], "shape": shape, "p50_s": ours["p50_s"],
                  "tcpstore_p50_s": peer["p50_s"], "speedup": round(peer["p50_s"] / ours["p50_s"], 1),
                  "tcpstore_protocol_p50_s": protocol_peer["p50_s"],
                  "speedup_vs_protocol_peer": round(protocol_peer["p50_s"] / ours["p50_s"], 1),
                  "leader_bytes_per_node": ours.get("leader_bytes_per_node_p50"),
                  "of_it_heartbeats": ours.get("leader_heartbeat_bytes_per_node_p50")}))
PY
