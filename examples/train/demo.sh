#!/usr/bin/env bash
# The training demo, with a bt-launch already built (scripts/demo.sh installs and builds,
# then runs this). Two nodes, as two bt-launch processes on this host, run job.json: the
# base model staged from a file:// source, the dataset seeded once into the project cache,
# torchrun with two gloo workers per node, Trainer-layout checkpoints uploaded to a file://
# destination. Then resume.json loads the latest checkpoint and trains on from its step, and
# restart.json shows a restart in place: node 1's worker dies at step 50 of the first cycle,
# every node restarts the job from the last committed checkpoint, and it finishes (with
# checkpoint and load directories of its own: the Trainer's rotation would delete its
# checkpoint-20 beside job 2's newer checkpoint-90, and job 2's load stays as it was).
#   examples/train/demo.sh [BT_LAUNCH]      (every path under /tmp/bt-launch-demo)
set -euo pipefail
cd "$(dirname "$0")/../.."
bt_launch=$(realpath "${1:-build/launcher/bt-launch}")
root=/tmp/bt-launch-demo  # the configs name it: weights[] paths are absolute
nodes=2
job_timeout_s=${DEMO_JOB_TIMEOUT_S:-150}  # then SIGTERM: bt-launch stops the job, drains, exits (SIGKILL 90 s later)
# Debian's python3-torch: its python3 and torchrun ahead of any other Python on PATH.
export PATH=/usr/bin:$PATH
export BT_RENDEZVOUS_TOKEN=${BT_RENDEZVOUS_TOKEN:-demo-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')}

exec 9>"$root.lock"
flock -n 9 || { echo "another demo is running (it holds $root.lock)" >&2; exit 1; }
rm -rf "$root"
python3 examples/train/prepare.py base-model "$root/sources/base-model"

# Runs one job as `nodes` bt-launch processes, each line prefixed with its node.
run_job() {
  local config=$1 pids=() status=0
  for rank in $(seq 0 $((nodes - 1))); do
    timeout -k 90 "$job_timeout_s" "$bt_launch" run --config "$config" --root "$root/nodes" \
      --node-rank "$rank" --node-count "$nodes" --leader-addr 127.0.0.1 > >(sed -u "s/^/[node $rank] /") 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
  return $status
}

echo "=== job 1 (examples/train/job.json): train from the base model"
run_job examples/train/job.json
echo "=== committed checkpoints of demo-train"
"$bt_launch" checkpoints --config examples/train/job.json --root "$root/nodes" 2>/dev/null
echo "=== job 2 (examples/train/resume.json): load the latest checkpoint and resume"
run_job examples/train/resume.json
echo "=== job 3 (examples/train/restart.json): node 1 fails at step 50; every node restarts in place"
run_job examples/train/restart.json
echo "=== what job 3's time became (node 0 wrote it beside the checkpoints; open the HTML in a browser)"
"$bt_launch" report --config examples/train/restart.json --root "$root/nodes" --out "$root/job3-report.html" 2>/dev/null
