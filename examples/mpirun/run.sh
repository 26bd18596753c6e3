#!/bin/bash
# A multi-node job under Open MPI's mpirun: one bt-launch per node. bt-launch reads its
# rank and count from OMPI_COMM_WORLD_RANK/SIZE; MPI variables never reach the training.
#   examples/mpirun/run.sh HOSTFILE      one line per node ("node01 slots=1"); node 0 leads
#   examples/mpirun/run.sh               NODES (default 2) processes on this host
# MPIRUN_ARGS adds mpirun options (e.g. "--allow-run-as-root --oversubscribe" in a container);
# MPI_KILL_TIMEOUT_S is how long mpirun waits between its SIGTERM and SIGKILL (default 660).
set -euo pipefail
hostfile=${1:-}
# When a rank fails, mpirun SIGTERMs the other launchers and SIGKILLs them this long after
# (Open MPI's default is 1 s): long enough for launcher.grace_period_s and the checkpoint
# drain (launcher.checkpoint.drain_timeout_s), or they are cut short.
kill_timeout=${MPI_KILL_TIMEOUT_S:-660}
args=(--bind-to none -x BT_RENDEZVOUS_TOKEN --mca odls_base_sigkill_timeout "$kill_timeout")
nodes=${NODES:-2}
if [ -n "$hostfile" ]; then
  nodes=$(grep -cEv '^[[:space:]]*(#|$)' "$hostfile")
  # Across hosts bt-launch cannot tell where rank 0 runs: the hostfile's first host leads.
  BT_LEADER_ADDR=$(awk '!/^[[:space:]]*(#|$)/ { print $1; exit }' "$hostfile")
  export BT_LEADER_ADDR
  args+=(--hostfile "$hostfile" --map-by ppr:1:node -x BT_LEADER_ADDR)
fi
export BT_RENDEZVOUS_TOKEN=${BT_RENDEZVOUS_TOKEN:-mpirun-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')}
# shellcheck disable=SC2086  # MPIRUN_ARGS is a list of options
exec mpirun -np "$nodes" "${args[@]}" ${MPIRUN_ARGS:-} bt-launch run --config "${BT_CONFIG:-$(dirname "$0")/job.json}"
