#!/bin/sh
# A stand-in for a training script, written the way cookbook scripts map the launcher's
# environment onto torchrun. Each node "trains" for a few steps and writes a checkpoint
# directory per step in the Hugging Face Trainer's layout (trainer_state.json last),
# atomically (write to a hidden staging dir, then rename); bt-launch uploads each one.
set -eu
: "${BT_NODE_RANK:?}" "${BT_GROUP_SIZE:?}" "${BT_LEADER_ADDR:?}" "${BT_CHECKPOINT_DIR:?}"
echo "node $BT_NODE_RANK/$BT_GROUP_SIZE: would run torchrun --nnodes=$NNODES --nproc-per-node=$NPROC_PER_NODE" \
     "--node-rank=$NODE_RANK --master-addr=$MASTER_ADDR --master-port=$MASTER_PORT"
steps=${TRAIN_STEPS:-3}
step=1
while [ "$step" -le "$steps" ]; do
  sleep "${STEP_SECONDS:-0.2}"
  staging="$BT_CHECKPOINT_DIR/.staging-$step"
  mkdir -p "$staging"
  echo "{\"step\": $step, \"node_rank\": $BT_NODE_RANK}" > "$staging/config.json"
  echo "{\"global_step\": $step}" > "$staging/trainer_state.json"
  mv "$staging" "$BT_CHECKPOINT_DIR/checkpoint-$step"
  echo "node $BT_NODE_RANK: step $step/$steps, checkpoint-$step written"
  step=$((step + 1))
done
if [ "${FAIL_ON_NODE:-}" = "$BT_NODE_RANK" ]; then
  echo "node $BT_NODE_RANK: simulated failure" >&2
  exit 3
fi
