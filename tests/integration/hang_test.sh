#!/usr/bin/env bash
# A hang on two nodes, as bt-launch processes on this host: torchrun with two gloo workers
# per node (examples/train), and in the first cycle rank 3 (node 1's second worker) stops
# before step 25's all_reduce for good while ranks 0-2 wait in it. Asserts that the hang is
# found within stall_timeout_s + 15 s, that node 0's report holds all four ranks' Python
# stacks and names rank 3, and that with max_restarts 1 the next cycle resumes from the
# last committed checkpoint and finishes.
#   tests/integration/hang_test.sh BT_LAUNCH SOURCE_DIR
set -euo pipefail
BIN=$(realpath "$1")
SOURCE_DIR=$(realpath "$2")
[ -x /usr/bin/torchrun ] || { echo "SKIPPED: Debian's python3-torch (torchrun) is not installed"; exit 77; }
export PATH=/usr/bin:$PATH
cd "$SOURCE_DIR"
work=$(mktemp -d /tmp/bt-hang-test.XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for rank in 0 1; do echo "--- node $rank"; tail -n 30 "$work/once-$rank.log"; done
  exit 1
}
# shellcheck source=common.sh
. "$(dirname "$0")/common.sh"
export BT_RENDEZVOUS_PORT=$(free_port) MASTER_PORT=$(free_port)
export BT_RENDEZVOUS_TOKEN=hang-test-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')
stall_timeout_s=10
# The startup window ends at the first new checkpoint (cycle 0: checkpoint-10), else after
# startup_timeout_s: cycle 1 of the "every" job resumes from checkpoint-20 and hangs at step
# 25, before its first save, so its hang is found startup_timeout_s after the cycle began.
startup_timeout_s=60

python3 examples/train/prepare.py base-model "$work/sources/base-model" >/dev/null
peer_grace_s=5
# write_config NAME HANG_SPEC: a job whose rank 3 hangs at HANG_SPEC (DEMO_HANG_ONCE).
write_config() {
  cat >"$work/$1.json" <<EOF
{
  "name": "$1",
  "compute": {"node_count": 2},
  "enable_baseten_workdir": false,
  "weights": [{"source": "file://$work/sources/base-model", "mount_location": "$work/models/base"}],
  "runtime": {
    "start_commands": ["sh examples/train/run.sh"],
    "environment_variables": {
      "NPROC_PER_NODE": "2", "BASE_MODEL": "$work/models/base", "TRAIN_STEPS": "40", "SAVE_STEPS": "10",
      "SAVE_TOTAL_LIMIT": "2", "OMP_NUM_THREADS": "1", "DEMO_HANG_ONCE": "$2", "HANG_TEST_MARK": "$work/$1"
    },
    "cache_config": {"enabled": true},
    "checkpointing_config": {"enabled": true}
  },
  "launcher": {
    "job_id": "$1",
    "grace_period_s": 10,
    "peer_failure_grace_s": $peer_grace_s,
    "restart": {"max_restarts": 1},
    "watchdog": {"stall_timeout_s": $stall_timeout_s, "startup_timeout_s": $startup_timeout_s},
    "cache": {"seed_commands": ["python3 examples/train/prepare.py dataset \"\$BT_PROJECT_CACHE_DIR/demo-dataset\""]},
    "checkpoint": {"destination": "file://$work/store", "drain_timeout_s": 60},
    "weights": {"timeout_s": 120},
    "rendezvous": {"join_timeout_s": 60}
  }
}
EOF
}

# start_job NAME: both nodes of job NAME in the background, logs in $work/NAME-<rank>.log.
start_job() {
  pids=()
  for rank in 0 1; do
    timeout -k 10 240 "$BIN" run --config "$work/$1.json" --root "$work/nodes-$1" --node-rank "$rank" --node-count 2 \
      --leader-addr 127.0.0.1 >"$work/$1-$rank.log" 2>&1 &
    pids+=($!)
  done
}

# wait_for FILE TEXT SECONDS: the time (epoch seconds) TEXT appeared in FILE.
wait_for() {
  local deadline=$((SECONDS + $3))
  until grep -qF -- "$2" "$1"; do
    [ "$SECONDS" -lt "$deadline" ] || fail "no '$2' in $1 within $3 s"
    sleep 0.2
  done
  date +%s.%N
}

# wait_all CODE: every node of the job exits CODE.
wait_all() {
  for i in 0 1; do
    code=0
    wait "${pids[$i]}" || code=$?
    [ "$code" -eq "$1" ] || fail "node $i exited $code, expected $1"
  done
  pids=()
}

write_config once 1:25
start_job once
hung_at=$(wait_for "$work/once-1.log" "hangs at step 25 (DEMO_HANG_ONCE)" 150)
found_at=$(wait_for "$work/once-0.log" "collecting every node's stacks" $((stall_timeout_s + 30)))
echo "== the hang was found $(awk -v a="$hung_at" -v b="$found_at" 'BEGIN { printf "%.1f", b - a }') s after rank 3 stopped (limit ${stall_timeout_s} s + 15 s)"
awk -v a="$hung_at" -v b="$found_at" -v limit=$((stall_timeout_s + 15)) 'BEGIN { exit !(b - a <= limit) }' ||
  fail "the hang was found later than stall_timeout_s + 15 s"
wait_all 0

echo "== node 0 named rank 3, in sleep_forever, as the odd one"
grep -q "watchdog: differs: 1 in sleep_forever (train.py:[0-9]*) < main (train.py:[0-9]*): rank 3 (node 1, host [^,]*, local rank 1, pid [0-9]*)" \
  "$work/once-0.log" || fail "node 0's summary does not name rank 3 in sleep_forever"
grep -q "watchdog: 3 of 4 ranks in all_reduce (distributed_c10d.py:[0-9]*)" "$work/once-0.log" ||
  fail "node 0's summary does not put the 3 other ranks in all_reduce"

grep -q "watchdog: node [01] ([^)]*) stopped making progress first, [0-9.]* s before the stacks were asked for" "$work/once-0.log" ||
  fail "node 0's summary does not name the node whose progress stopped first"

echo "== the report holds every rank's Python stack"
report=$(ls "$work"/nodes-once/node-0/mnt/bt-scratch/bt-launch/hang-*-cycle-0.txt)
for rank in 0 1 2 3; do
  grep -q "^-- rank $rank (node [01], host [^,]*, local rank [01], pid [0-9]*)" "$report" || fail "rank $rank is not in $report"
done
[ "$(grep -c 'line [0-9]* in all_reduce' "$report")" -ge 3 ] || fail "fewer than 3 ranks in all_reduce in $report"
grep -q "line [0-9]* in sleep_forever" "$report" || fail "no sleep_forever frame in $report"
grep -q "NCCL flight recorder" "$report" || fail "the report says nothing of the NCCL flight recorder"
grep -q "native frames: " "$report" || fail "the report says nothing of native frames"

echo "== the hang restarted every node from checkpoint-20, and cycle 1 finished"
for rank in 0 1; do
  grep -q "restarts: cycle 1 (node 1 ([^)]*) hung: no progress on any node for" "$work/once-$rank.log" ||
    fail "node $rank's timeline does not name node 1's hang as cycle 1's cause"
done
grep -q "running cycle 1 (BT_RESTART_COUNT=1), resuming from checkpoint checkpoint-20" "$work/once-0.log" ||
  fail "cycle 1 did not resume from checkpoint-20"
grep -q "train: 4 workers on 2 nodes, steps 21..40" "$work/once-0.log" || fail "cycle 1 did not train on from step 21"
[ "$(cat "$work/store/once/latest")" = checkpoint-40 ] || fail "latest is not checkpoint-40"

echo "== a hang at the same place in the next cycle is named so, and ends the job with 124 on every node"
write_config every 1:25:every
start_job every
aborted_at=$(wait_for "$work/every-0.log" "rendezvous: aborting the job" 200)
wait_all 124
grep -q "the same hang as in cycle 0" "$work/every-0.log" || fail "node 0 did not name cycle 1's hang as cycle 0's again"
while grep -qlF "HANG_TEST_MARK=$work/every" /proc/[0-9]*/environ 2>/dev/null; do
  awk -v a="$aborted_at" -v now="$(date +%s.%N)" -v limit=$((peer_grace_s + 2)) 'BEGIN { exit !(now - a <= limit) }' ||
    fail "a process of the job outlived the abort by more than peer_failure_grace_s + 2 s"
  sleep 0.2
done
echo "PASS"
