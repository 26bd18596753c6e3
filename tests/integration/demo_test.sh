#!/usr/bin/env bash
# The README's demo job (examples/train/demo.sh) with the built binary: two nodes train
# with torchrun and gloo, checkpoints are committed, a second job loads the latest and
# resumes from its step, and a third restarts in place after node 1's worker dies at step
# 50. Asserts on the output and on what reached the destination.
set -euo pipefail
BIN=$(realpath "$1")
SOURCE_DIR=$(realpath "$2")
[ -x /usr/bin/torchrun ] || { echo "SKIPPED: Debian's python3-torch (torchrun) is not installed"; exit 77; }
out=$(mktemp /tmp/bt-demo-test.XXXXXX)
trap 'rm -f "$out"' EXIT
# shellcheck source=common.sh
. "$(dirname "$0")/common.sh"
export BT_RENDEZVOUS_PORT=$(free_port) MASTER_PORT=$(free_port)

fail() { echo "FAIL: $*"; tail -n 40 "$out"; exit 1; }
timeout -k 10 280 "$SOURCE_DIR/examples/train/demo.sh" "$BIN" >"$out" 2>&1 || fail "the demo exited $?"

store=/tmp/bt-launch-demo/checkpoint-store
echo "== job 1 trained on 4 workers and its loss went down"
grep -q "train: 4 workers on 2 nodes, steps 1..60" "$out" || fail "job 1 did not start 4 workers"
loss() { grep -o "train: step $1/[0-9]* loss [0-9.]*" "$out" | awk '{print $NF}'; }
awk -v first="$(loss 10)" -v last="$(loss 60)" 'BEGIN { exit !(first > 0 && last < first / 2) }' \
  || fail "loss did not halve: step 10 $(loss 10), step 60 $(loss 60)"

# part RANK NAME: the directory of node RANK's committed version of checkpoint NAME (its
# commit record under .bt-commits/ names it).
part() {
  python3 - "$store/demo-train" "$1" "$2" <<'PY'
import json, os, sys
job, rank, name = sys.argv[1:]
commits = os.path.join(job, ".bt-commits")
for path in os.listdir(commits) if os.path.isdir(commits) else []:
    record = json.load(open(os.path.join(commits, path)))
    if record["name"] == name and rank in record["parts"]:
        print(os.path.join(job, "rank-" + rank, ".bt-versions", record["parts"][rank]))
PY
}
echo "== every checkpoint of job 1 committed from both nodes, latest last"
[ "$(cat "$store/demo-train/latest")" = checkpoint-60 ] || fail "demo-train/latest is not checkpoint-60"
for rank in 0 1; do
  for step in 20 40 60; do
    [ -f "$(part $rank checkpoint-$step)/checkpoint-$step.bt-manifest.json" ] || fail "rank $rank checkpoint-$step not committed"
  done
  cmp -s "$(part $rank checkpoint-60)/checkpoint-60/pytorch_model.bin" \
    "/tmp/bt-launch-demo/nodes/node-$rank/tmp/loaded_checkpoints/rank-$rank/checkpoint-60/pytorch_model.bin" \
    || fail "node $rank did not load checkpoint-60 byte-identical"
done
grep -q "checkpoint-20 .*huggingface" "$out" || fail "the listing between the jobs is missing"

echo "== job 2 resumed at step 60 and trained on to 90, below job 1's last loss"
grep -q "train: resumed from .*/rank-0/checkpoint-60 at step 60" "$out" || fail "job 2 did not resume from checkpoint-60"
grep -q "train: 4 workers on 2 nodes, steps 61..90" "$out" || fail "job 2 did not continue from step 61"
awk -v before="$(loss 60)" -v after="$(loss 90)" 'BEGIN { exit !(after < before) }' \
  || fail "loss after resuming ($(loss 90)) is not below step 60's ($(loss 60))"
[ "$(cat "$store/demo-train-resumed/latest")" = checkpoint-90 ] || fail "demo-train-resumed/latest is not checkpoint-90"
[ ! -e "$store/demo-train-resumed/rank-0/checkpoint-60" ] || fail "job 1's checkpoint-60 was uploaded again as job 2's"

echo "== job 3 restarted in place when node 1 failed at step 50, from its own last committed checkpoint"
job3=$(sed -n '/=== job 3/,$p' "$out")
grep -q "train: 4 workers on 2 nodes, steps 1..60" <<<"$job3" || fail "job 3 took job 2's load for its starting point"
grep -q "train: node 1 fails at step 50" <<<"$job3" || fail "job 3's injected failure did not happen"
# Node 1's worker exits 3; node 0's gloo collectives fail within milliseconds of it, so
# either torchrun may end first: the cycle names the failure node 0 heard of first.
culprit=$(grep -o "^\[node 0\] .*restarts: cycle 1 (node [01] (" <<<"$job3" | grep -o "node [01] ($" || true)
[ -n "$culprit" ] || fail "node 0 did not restart in cycle 1 naming a failed node"
grep -q "^\[node 1\] .*restarts: cycle 1 ($culprit" <<<"$job3" || fail "node 1 did not restart in cycle 1 naming $culprit"
resumed=$(grep -o "^\[node 0\] .*every node is ready: running cycle 1 (BT_RESTART_COUNT=1), resuming from checkpoint checkpoint-[0-9]*" \
  <<<"$job3" | grep -o "checkpoint-[0-9]*$" || true)
[ "$resumed" = checkpoint-20 ] || [ "$resumed" = checkpoint-40 ] || fail "cycle 1 resumed from '$resumed', not checkpoint-20 or -40"
step=${resumed#checkpoint-}
grep -q "train: resumed from .*/rank-0/$resumed at step $step" <<<"$job3" || fail "the training did not resume from $resumed"
grep -q "train: 4 workers on 2 nodes, steps $((step + 1))..60" <<<"$job3" || fail "cycle 1 did not train on from step $step"
[ "$(cat "$store/demo-train-restart/latest")" = checkpoint-60 ] || fail "demo-train-restart/latest is not checkpoint-60"

echo "== the demo ends with job 3's goodput: the restart in its table, the report written"
report=$(sed -n '/=== what job 3/,$p' "$out")
grep -q "^goodput .* of .* wall time" <<<"$report" || fail "the demo did not print job 3's goodput table"
grep -q "^  0 *failure .* checkpoint-[24]0$" <<<"$report" || fail "job 3's goodput table does not charge cycle 0's failure"
grep -q "^  1 *success " <<<"$report" || fail "job 3's goodput table has no cycle 1 after the restart"
grep -q "^report: /tmp/bt-launch-demo/job3-report.html" <<<"$report" || fail "the demo did not say where the report is"
[ -s /tmp/bt-launch-demo/job3-report.html ] || fail "the report was not written"

echo "== weights staged once, the cache seeded once, every node ends with its timeline"
[ "$(grep -c 'weights: staged file://' "$out")" -eq 1 ] || fail "the base model was not staged exactly once"
[ "$(grep -c 'cache seed: running 1 command' "$out")" -eq 1 ] || fail "the dataset was not seeded exactly once"
[ "$(grep -c '] .*timeline: identity.*(job exit 0), total' "$out")" -eq 6 ] || fail "not every node of the three jobs ended with exit 0"
echo "PASS"
