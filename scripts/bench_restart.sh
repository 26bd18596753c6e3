#!/usr/bin/env bash
# Restart in place, fault to every node training again: NODES (2 and 4) simulated nodes on
# loopback run tests/bench/restart_worker.py, which fails on node 1 after 2 s in cycle 0.
# Under bt-launch (launcher.restart.max_restarts 1, one bt-launch per node) and, in the same
# run, under Debian's torchrun (--max_restarts=1 --rdzv_backend=c10d, one agent per node,
# --monitor_interval 0.1 and its default). Figures, from the workers' own stamps (the same
# for both; wall clock of one host): fault -> every other node's job stopped (SIGTERM
# seen), fault -> every node's job started again; for bt-launch also from its own log
# (fault logged -> every node stopped -> every node's start command logged). Median of RUNS.
# KEEP=1 keeps the logs.
# Prints a table, then one JSON line.
#   RUNS=3 NODES="2 4" BUILD_DIR=build
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-3}
node_counts=${NODES:-"2 4"}
binary=$(realpath "${BUILD_DIR:-build}/launcher/bt-launch")
worker=$(realpath tests/bench/restart_worker.py)
[ -x "$binary" ] || ./scripts/build.sh >/dev/null
work=$(mktemp -d /tmp/bt-restart-bench.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null; [ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT

port_below_ephemeral() {  # a free port in [20000, 32000): never the 32768-60999 range
  python3 -c 'import random, socket
while True:
    p = random.randrange(20000, 32000); s = socket.socket()
    try: s.bind(("127.0.0.1", p)); print(p); break
    except OSError: pass'
}

run_btlaunch() {  # $1 nodes, $2 output dir
  local nodes=$1 out=$2 port
  port=$(port_below_ephemeral)
  cat > "$out/job.json" <<JSON
{"compute": {"node_count": $nodes}, "enable_baseten_workdir": false,
 "runtime": {"start_commands": ["BENCH_NODE=\$BT_NODE_RANK BENCH_MARK_DIR=$out exec /usr/bin/python3 $worker"]},
 "launcher": {"job_id": "restart-bench", "peer_failure_grace_s": 5, "master_port": $((port + 100)),
              "rendezvous": {"port": $port, "join_timeout_s": 60, "heartbeat_interval_s": 0.5, "heartbeat_timeout_s": 5},
              "restart": {"max_restarts": 1}}}
JSON
  for ((rank = 0; rank < nodes; rank++)); do
    BT_NODE_RANK=$rank BT_GROUP_SIZE=$nodes BT_LEADER_ADDR=127.0.0.1 BT_RENDEZVOUS_TOKEN=bench \
      timeout 120 "$binary" run --config "$out/job.json" --root "$out/root" > "$out/node$rank.out" 2> "$out/node$rank.log" &
  done
  wait
}

run_torchrun() {  # $1 nodes, $2 output dir, $3 monitor interval ("" for torchrun's default)
  local nodes=$1 out=$2 interval=$3 port
  port=$(port_below_ephemeral)
  for ((rank = 0; rank < nodes; rank++)); do
    BENCH_NODE=$rank BENCH_MARK_DIR=$out timeout 180 /usr/bin/torchrun --nnodes="$nodes" --nproc_per_node=1 --max_restarts=1 \
      --rdzv_backend=c10d --rdzv_endpoint="127.0.0.1:$port" --rdzv_id="bench$port" ${interval:+--monitor_interval=$interval} \
      --redirects=1 --tee=1 --log_dir="$out/logs$rank" "$worker" > "$out/node$rank.out" 2> "$out/node$rank.log" &
  done
  wait
}

results=()
for nodes in $node_counts; do
  for ((run = 1; run <= runs; run++)); do
    for peer in bt-launch "torchrun-0.1" "torchrun-default"; do
      out=$work/$peer-$nodes-$run
      mkdir -p "$out"
      case $peer in
        bt-launch) run_btlaunch "$nodes" "$out" || true ;;
        torchrun-0.1) run_torchrun "$nodes" "$out" 0.1 || true ;;
        torchrun-default) run_torchrun "$nodes" "$out" "" || true ;;
      esac
      results+=("$peer $nodes $out")
    done
  done
done

printf '%s\n' "${results[@]}" | /usr/bin/python3 tests/bench/restart_figures.py
