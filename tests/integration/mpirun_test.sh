#!/usr/bin/env bash
# `mpirun -np 4 bt-launch run --config examples/...` with both rendezvous backends: every
# rank runs the example training, the job exits 0, and no MPI variable reaches the job.
set -euo pipefail
BIN=$(realpath "$1")
SOURCE_DIR=$(realpath "$2")
command -v mpirun >/dev/null || { echo "SKIPPED: mpirun is not installed"; exit 77; }
work=$(mktemp -d /tmp/bt-mpirun.XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$SOURCE_DIR"
mpirun_args=(--oversubscribe -np 4)
[ "$(id -u)" -eq 0 ] && mpirun_args+=(--allow-run-as-root)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

fail() { echo "FAIL: $*"; tail -n 30 "$work/out"; exit 1; }

for example in multi-node multi-node-mpi; do
  echo "== $example"
  rm -rf "$work/root"
  BT_RENDEZVOUS_PORT=$port timeout 120 mpirun "${mpirun_args[@]}" -x BT_RENDEZVOUS_PORT \
    "$BIN" run --config "examples/$example.json" --root "$work/root" >"$work/out" 2>&1 || fail "$example: mpirun exited $?"
  for rank in 0 1 2 3; do
    grep -q "node $rank: step 3/3, checkpoint-3 written" "$work/out" || fail "$example: node $rank did not train"
    [ -d "$work/root/node-$rank/mnt/ckpts/checkpoint-3" ] || fail "$example: node $rank has no checkpoint-3"
  done
  grep -q "rank from Open MPI" "$work/out" || fail "$example: identity did not come from Open MPI"
done

echo "== no MPI variable reaches the job (both backends)"
for backend in tcp mpi; do
  cat > "$work/leak.json" <<JSON
{"compute": {"node_count": 4}, "enable_baseten_workdir": false,
 "runtime": {"start_commands": ["if env | grep -E '^(OMPI|PMIX|PMI|PRTE)_'; then exit 9; fi; echo clean-\$BT_NODE_RANK"]},
 "launcher": {"rendezvous": {"backend": "$backend"}}}
JSON
  BT_RENDEZVOUS_PORT=$port timeout 120 mpirun "${mpirun_args[@]}" -x BT_RENDEZVOUS_PORT \
    "$BIN" run --config "$work/leak.json" --root "$work/root" >"$work/out" 2>&1 || fail "$backend: MPI variables leaked"
  [ "$(grep -c '^clean-' "$work/out")" -eq 4 ] || fail "$backend: not every rank ran"
done

echo "== a failing rank fails the job (tcp backend names it)"
FAIL_ON_NODE=2 BT_RENDEZVOUS_PORT=$port timeout 120 mpirun "${mpirun_args[@]}" -x BT_RENDEZVOUS_PORT -x FAIL_ON_NODE \
  "$BIN" run --config examples/multi-node.json --root "$work/root" >"$work/out" 2>&1 && fail "the job succeeded"
grep -q "job failed: node 2 (" "$work/out" || fail "no node named node 2 as the failure"

echo "== launchers mpirun SIGKILLs take their training with them (both backends)"
# Node 3 fails at once; the others' training ignores SIGTERM, so mpirun's SIGKILL (1 s
# after its SIGTERM, Open MPI's default) hits their launchers mid-grace.
for backend in tcp mpi; do
  rm -f "$work"/train-*.pid
  cat > "$work/orphan.json" <<JSON
{"compute": {"node_count": 4}, "enable_baseten_workdir": false,
 "runtime": {"start_commands": ["if [ \$BT_NODE_RANK = 3 ]; then sleep 2; exit 3; fi; trap '' TERM; sleep 300 & echo \$! > $work/train-\$BT_NODE_RANK.pid; wait"]},
 "launcher": {"grace_period_s": 60, "rendezvous": {"backend": "$backend"}}}
JSON
  BT_RENDEZVOUS_PORT=$port timeout 120 mpirun "${mpirun_args[@]}" --mca odls_base_sigkill_timeout 1 -x BT_RENDEZVOUS_PORT \
    "$BIN" run --config "$work/orphan.json" --root "$work/root" >"$work/out" 2>&1 && fail "$backend: the job succeeded"
  sleep 2
  for rank in 0 1 2; do
    pid=$(cat "$work/train-$rank.pid" 2>/dev/null) || fail "$backend: node $rank never started its training"
    if kill -0 "$pid" 2>/dev/null && ! grep -q '^State:.*Z' "/proc/$pid/status"; then
      kill -KILL "$pid"
      fail "$backend: node $rank's training (pid $pid) outlived its launcher"
    fi
  done
done
echo "PASS"
