#!/usr/bin/env bash
# The rendezvous under N nodes arriving together: `bt-launch bench rendezvous` against the
# same pattern on torch's TCPStore (Debian's python3-torch), in one run; prints both tables,
# then one JSON line with the ratio at PEER_NODES.
#   NODES="1024 16384" PEER_NODES=1024 RUNS=3 BUILD_DIR=build
set -euo pipefail
cd "$(dirname "$0")/.."
binary=${BUILD_DIR:-build}/launcher/bt-launch
[ -x "$binary" ] || ./scripts/build.sh >/dev/null
runs=${RUNS:-3}
peer_nodes=${PEER_NODES:-1024}
work=$(mktemp -d /tmp/bt-bench-rendezvous.XXXXXX)
trap 'rm -rf "$work"' EXIT

for nodes in ${NODES:-1024 16384}; do
  echo "== bt-launch bench rendezvous --nodes $nodes"
  "$binary" bench rendezvous --nodes "$nodes" --runs "$runs" 2>/dev/null | tee "$work/bt-$nodes"
done
[ -f "$work/bt-$peer_nodes" ] || "$binary" bench rendezvous --nodes "$peer_nodes" --runs "$runs" 2>/dev/null > "$work/bt-$peer_nodes"
echo "== torch TCPStore, the same pattern, $peer_nodes nodes, one client thread each"
/usr/bin/python3 tests/bench/tcpstore_rendezvous.py "$peer_nodes" "$runs" | tee "$work/torch"
python3 - "$work/bt-$peer_nodes" "$work/torch" <<'PY'
import json, sys
ours = json.loads(open(sys.argv[1]).read().splitlines()[-1])
peer = json.loads(open(sys.argv[2]).read().splitlines()[-1])
print(json.dumps({"nodes": ours["nodes"], "p50_s": ours["p50_s"], "tcpstore_p50_s": peer["p50_s"],
                  "speedup": round(peer["p50_s"] / ours["p50_s"], 1)}))
PY
