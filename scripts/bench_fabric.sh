#!/usr/bin/env bash
# What the fabric exchange and plan add to a rendezvous: NODES real `bt-launch rendezvous`
# processes on loopback, started together, each reading its own 8-rail InfiniBand sysfs
# tree (the ib8-ndr-a fixture with per-node GUIDs and LIDs), with launcher.fabric.require
# "ib" (inventories exchanged, node 0 plans) and "none" (no exchange), RUNS times each.
# Figures come from node 0's timeline. Prints a table, then one JSON line.
#   NODES=64 RUNS=3 BUILD_DIR=build
set -euo pipefail
cd "$(dirname "$0")/.."
nodes=${NODES:-64}
runs=${RUNS:-3}
binary=${BUILD_DIR:-build}/launcher/bt-launch
[ -x "$binary" ] || ./scripts/build.sh >/dev/null
work=$(mktemp -d /tmp/bt-fabric-bench.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT

# One sysfs tree per node: GUIDs and LIDs must differ, or node 0 reports cloned GUIDs.
for ((rank = 0; rank < nodes; rank++)); do
  tree=$work/node$rank
  cp -a tests/fixtures/fabric/ib8-ndr-a "$tree"
  for device in "$tree"/sys/devices/pci0000:00/*/infiniband/*; do
    index=${device##*mlx5_}
    guid=$(printf 'a088:c203:%04x:%04x' $((0x100 + rank)) $((0x58e8 + index)))
    echo "$guid" > "$device/node_guid"
    echo "$guid" > "$device/sys_image_guid"
    printf '0x%x\n' $((0x100 + rank * 8 + index)) > "$device/ports/1/lid"
  done
done

# Milliseconds of phase $2 in timeline line of log $1 ("fabric 3.2 ms" or "fabric 1.02 s").
phase_ms() {
  grep -o "timeline: .*" "$1" | grep -oE "$2 [0-9.]+ (ms|s)" | awk '{ print ($3 == "s") ? $2 * 1000 : $2 }'
}

run_job() {  # $1 = require policy; prints "rendezvous_ms fabric_ms" of node 0
  local require=$1 port
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  cat > "$work/job.json" <<JSON
{"compute": {"node_count": $nodes}, "enable_baseten_workdir": false,
 "launcher": {"rendezvous": {"port": $port, "join_timeout_s": 60}, "fabric": {"require": "$require"}}}
JSON
  local pids=()
  for ((rank = 0; rank < nodes; rank++)); do
    BT_NODE_RANK=$rank BT_GROUP_SIZE=$nodes BT_LEADER_ADDR=127.0.0.1 BT_RENDEZVOUS_TOKEN=bench \
      BT_SYSFS_ROOT=$work/node$rank/sys timeout 120 "$binary" rendezvous --config "$work/job.json" \
      --root "$work/root" >/dev/null 2>"$work/log$rank" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || { echo "a node failed:" >&2; cat "$work/log0" >&2; exit 1; }; done
  echo "$(phase_ms "$work/log0" rendezvous) $(phase_ms "$work/log0" fabric)"
}

median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

declare -A rendezvous_ms fabric_ms
for require in none ib; do
  results=()
  for ((run = 0; run < runs; run++)); do results+=("$(run_job "$require")"); done
  rendezvous_ms[$require]=$(printf '%s\n' "${results[@]}" | awk '{ print $1 }' | median)
  fabric_ms[$require]=$(printf '%s\n' "${results[@]}" | awk '{ print $2 }' | median)
done
added=$(awk -v a="${fabric_ms[ib]}" -v b="${fabric_ms[none]}" 'BEGIN { printf "%.1f", a - b }')

printf '%-42s %14s %10s\n' "$nodes nodes, 8 IB rails each (median of $runs)" "rendezvous ms" "fabric ms"
printf '%-42s %14s %10s\n' "require none (no exchange)" "${rendezvous_ms[none]}" "${fabric_ms[none]}"
printf '%-42s %14s %10s\n' "require ib (exchange + plan)" "${rendezvous_ms[ib]}" "${fabric_ms[ib]}"
printf '%-42s %14s %10s\n' "added by the fabric check" "" "$added"
printf '{"nodes": %d, "rails": 8, "runs": %d, "fabric_none_ms": %s, "fabric_ib_ms": %s, "added_ms": %s}\n' \
  "$nodes" "$runs" "${fabric_ms[none]}" "${fabric_ms[ib]}" "$added"
