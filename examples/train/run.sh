#!/bin/sh
# The start command: torchrun from the environment bt-launch exported, the way cookbook
# scripts map it (static rendezvous on node 0's MASTER_ADDR:MASTER_PORT).
# --redirects=1 --tee=1: each worker's stdout is copied to the console with its local rank
# in front; it also sidesteps torch 1.13's torchrun under Python 3.11 (Debian bookworm),
# whose default "0" for both parses to None and stops the agent before any worker starts.
set -eu
cd "$(dirname "$0")"
exec torchrun --nnodes="$NNODES" --nproc_per_node="$NPROC_PER_NODE" --node_rank="$NODE_RANK" \
  --master_addr="$MASTER_ADDR" --master_port="$MASTER_PORT" --redirects=1 --tee=1 train.py
