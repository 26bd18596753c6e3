#!/usr/bin/env bash
# bt-launch under a real Slurm (Debian's slurm-wlm, munge): slurmctld in this namespace and
# four slurmd, each in its own network namespace (entered with `nsenter --net`: Debian's
# slurmd refuses `ip netns exec`, which hides /sys/fs/cgroup) with its own address, host
# name and /etc/hosts. Then what a cluster user does: a job whose node 1 fails (the job's
# code reaches srun and the controller), a step on nodes 3-4 of 4 (its own leader), two
# tasks per node (65, named), two jobs of one config sharing nodes (never one rendezvous),
# scancel (nothing left), and examples/slurm/train.sbatch submitted with sbatch: real
# torchrun and gloo workers, node-local /scratch checkpoints uploaded to a shared /shared.
# sacct needs slurmdbd and a database, so the job's code is read from the controller. SKIPPED (77) where namespaces or the packages are missing;
# every wait has a deadline; daemons, namespaces and files are removed on exit.
set -euo pipefail
BIN=$(realpath "$1")
SOURCE_DIR=$(cd "$(dirname "$0")/../.." && pwd)
skip() { echo "SKIPPED: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "network namespaces and slurmd need root"
for tool in ip nsenter unshare slurmctld slurmd srun sbatch scontrol scancel munged; do
  command -v "$tool" >/dev/null || skip "$tool is not installed (scripts/install-deps.sh installs slurm-wlm and munge)"
done

readonly kNodes=4
readonly kCtldPort=26817   # test ports stay below 32768
readonly kSlurmdPort=26818
tag="bs$$"
bridge="${tag}br"

# A run killed outright (SIGKILL from ctest's timeout) cannot clean up: its namespaces,
# bridge (holding this test's subnet), daemons and files would make every later run fail.
# Each run's names carry its pid; what belongs to a pid no longer alive is removed here.
remove_stale_runs() {
  local stale_tag pid dir
  for dir in /tmp/bt-slurm-bs*; do
    [ -d "$dir" ] || continue
    stale_tag=${dir#/tmp/bt-slurm-}; stale_tag=${stale_tag%%.*}; pid=${stale_tag#bs}
    kill -0 "$pid" 2>/dev/null && continue
    pkill -9 -f -- "$dir/" 2>/dev/null || true  # its slurmctld and munged name files in it
    for ns in $(ip netns list | awk '{print $1}' | grep "^${stale_tag}n[0-9]*$"); do
      for member in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$member" 2>/dev/null || true; done
      ip netns del "$ns" 2>/dev/null || true
    done
    ip link del "${stale_tag}br" 2>/dev/null || true
    while read -r mount_point; do rmdir "$mount_point" 2>/dev/null || true; done < "$dir/made-mount-points" 2>/dev/null || true
    rm -rf "$dir"
    echo "removed what a killed earlier run ($stale_tag) left behind"
  done
}
remove_stale_runs

work=$(mktemp -d "/tmp/bt-slurm-$tag.XXXXXX")
chmod 755 "$work"
pids=()
# examples/slurm/job.json's paths: /scratch is each node's own, /shared is every node's.
# Each slurmd's mount namespace binds a folder of $work over them; the host only needs
# the two mount points, removed again if this test made them.
made_mount_points=()
for dir in /scratch /shared; do
  [ -e "$dir" ] || { mkdir "$dir"; made_mount_points+=("$dir"); echo "$dir" >> "$work/made-mount-points"; }
done

cleanup() {
  scancel --quiet --full "--name=${tag}" 2>/dev/null || true
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  for i in $(seq 1 $kNodes); do
    for pid in $(ip netns pids "${tag}n$i" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "${tag}n$i" 2>/dev/null || true
  done
  ip link del "$bridge" 2>/dev/null || true
  for dir in "${made_mount_points[@]}"; do rmdir "$dir" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*"
  for f in "$work"/*.log "$work"/out/*; do [ -f "$f" ] && { echo "--- $f"; tail -n 25 "$f"; }; done
  exit 1
}

# --- the cluster ----------------------------------------------------------------------

if ! ip link add "$bridge" type bridge 2>/dev/null || ! ip netns add "${tag}probe" 2>/dev/null; then
  skip "cannot create network namespaces here"
fi
ip netns del "${tag}probe"
ip link set "$bridge" up
ip addr add 10.78.0.1/24 dev "$bridge"
printf '127.0.0.1 localhost\n10.78.0.1 %s\n' "$(hostname -s)" > "$work/hosts"
for i in $(seq 1 $kNodes); do
  ns="${tag}n$i"
  ip netns add "$ns"
  ip link add "${tag}v$i" type veth peer name eth0 netns "$ns"
  ip link set "${tag}v$i" master "$bridge" up
  ip -n "$ns" link set lo up
  ip -n "$ns" link set eth0 up
  ip -n "$ns" addr add "10.78.0.1$i/24" dev eth0
  echo "10.78.0.1$i node0$i" >> "$work/hosts"
done

mkdir -p "$work/munge" "$work/state" "$work/out" "$work/root" "$work/shared"
for i in $(seq 1 $kNodes); do mkdir -p "$work/spool-node0$i" "$work/scratch-node0$i"; done
chmod 700 "$work/munge"
head -c 1024 /dev/urandom > "$work/munge/key"
chmod 400 "$work/munge/key"
munged --force --socket="$work/munge/socket" --key-file="$work/munge/key" --pid-file="$work/munge/pid" \
  --seed-file="$work/munge/seed" --log-file="$work/munged.log" || skip "munged does not start here"
pids+=("$(cat "$work/munge/pid")")

export SLURM_CONF="$work/slurm.conf"
cat > "$SLURM_CONF" <<CONF
ClusterName=bttest
SlurmctldHost=$(hostname -s)(10.78.0.1)
SlurmctldPort=$kCtldPort
SlurmdPort=$kSlurmdPort
AuthInfo=socket=$work/munge/socket
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool-%n
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd-%n.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
MailProg=/bin/true
NodeName=node0[1-$kNodes] NodeAddr=10.78.0.1[1-$kNodes] CPUs=2 RealMemory=100 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=10 State=UP
CONF

nice -n 19 slurmctld -D -f "$SLURM_CONF" >"$work/slurmctld.out" 2>&1 &
pids+=($!); disown $!
for i in $(seq 1 $kNodes); do
  # A mount namespace of its own for the node's /etc/hosts, /scratch and /shared; UTS for
  # its host name.
  nsenter --net="/run/netns/${tag}n$i" unshare --mount --uts sh -c \
    "mount --bind '$work/hosts' /etc/hosts && mount --bind '$work/scratch-node0$i' /scratch &&
     mount --bind '$work/shared' /shared && hostname node0$i &&
     exec nice -n 19 slurmd -D -N node0$i -f '$SLURM_CONF'" \
    >"$work/slurmd-$i.out" 2>&1 &
  pids+=($!); disown $!
done

wait_idle() {  # every node idle within the deadline
  local deadline=$((SECONDS + 60))
  until [ "$(sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l)" -eq $kNodes ]; do
    [ $SECONDS -lt $deadline ] || fail "the nodes never became idle: $(sinfo -N 2>&1 | tr '\n' ' ')"
    sleep 0.5
  done
}
wait_idle
echo "cluster: $kNodes nodes idle"

cat > "$work/job.json" <<JSON
{"compute": {"node_count": 2}, "enable_baseten_workdir": false,
 "runtime": {"start_commands": ["echo \"job \$BT_TRAINING_JOB_ID node \$BT_NODE_RANK start\"; sleep \${TRAIN_SECONDS:-1}"]},
 "launcher": {"grace_period_s": 5,
              "rendezvous": {"join_timeout_s": 15, "heartbeat_interval_s": 0.5, "heartbeat_timeout_s": 5}}}
JSON
cd "$work"
step() { timeout 120 srun --job-name="$tag" --time=2 "$@"; }
job_state() { scontrol show job "$1" | grep -o 'JobState=[A-Z]*\|ExitCode=[0-9:]*' | tr '\n' ' '; }
job_exit_code() { scontrol show job "$1" | grep -o 'ExitCode=[0-9:]*' | head -n 1 | cut -d= -f2; }
# wait_job_end JOBID SECONDS: until the controller has the batch job's end, or fail.
wait_job_end() {
  local deadline=$((SECONDS + $2))
  until scontrol show job "$1" | grep -qE "JobState=(FAILED|COMPLETED|CANCELLED|TIMEOUT)"; do
    [ $SECONDS -lt $deadline ] || fail "batch job $1 did not end within $2 s: $(job_state "$1")"
    sleep 0.5
  done
}

# --- 1. the job's exit code reaches the scheduler --------------------------------------
code=0
step -N2 --ntasks-per-node=1 "$BIN" run --config job.json --root "$work/root" -- \
  sh -c '[ "$BT_NODE_RANK" = 1 ] && { sleep 0.5; exit 3; }; exec sleep 60' >"$work/out/exit.out" 2>&1 || code=$?
[ "$code" -eq 3 ] || fail "srun exited $code when node 1's training exited 3 (expected 3, the training's code)"
grep -q "exiting with node 1's exit code 3" "$work/out/exit.out" || fail "node 0 does not name node 1 as the source of its code"
jobid=$(sbatch --parsable --job-name="$tag" -N2 -o "$work/out/batch-exit.out" --wrap \
  "srun --ntasks-per-node=1 --kill-on-bad-exit=1 $BIN run --config $work/job.json --root $work/root -- sh -c '[ \"\$BT_NODE_RANK\" = 1 ] && exit 3; exec sleep 60'")
wait_job_end "$jobid" 90
[ "$(job_exit_code "$jobid")" = 3:0 ] || fail "batch job: $(job_state "$jobid")"
echo "exit code: srun 3, batch job ExitCode=3:0"

# --- 2. a step on nodes 3-4 of 4 finds its own leader ----------------------------------
jobid=$(sbatch --parsable --job-name="$tag" -N4 -o "$work/out/step.out" --wrap \
  "srun -N2 --relative=2 $BIN rendezvous --config $work/job.json")
wait_job_end "$jobid" 90
[ "$(job_exit_code "$jobid")" = 0:0 ] || fail "a step on nodes 3-4 failed: $(cat "$work/out/step.out")"
grep -q "leader node03 (from Slurm)" "$work/out/step.out" || fail "the step's leader is not node03"
echo "step on nodes 3-4: leader node03, rendezvous ok"

# --- 3. two tasks per node are named at once -------------------------------------------
code=0
step -N2 --ntasks-per-node=2 "$BIN" rendezvous --config job.json >"$work/out/tasks.out" 2>&1 || code=$?
[ "$code" -eq 65 ] || fail "two tasks per node: srun exited $code, expected 65"
grep -q -- "--ntasks-per-node=1" "$work/out/tasks.out" || fail "two tasks per node: the fix is not named"
echo "two tasks per node: 65 naming --ntasks-per-node=1"

# --- 4. two jobs of one config on shared nodes never form one rendezvous ---------------
TRAIN_SECONDS=3 step -N2 -w node01,node02 --ntasks-per-node=1 "$BIN" run --config job.json --root "$work/root" \
  >"$work/out/job-a.out" 2>&1 &
job_a=$!
sleep 0.3
TRAIN_SECONDS=3 step -N2 -w node01,node02 --ntasks-per-node=1 "$BIN" run --config job.json --root "$work/root" \
  >"$work/out/job-b.out" 2>&1 &
job_b=$!
code_a=0; wait $job_a || code_a=$?
code_b=0; wait $job_b || code_b=$?
# Both node 0s want port 29300: one job gets it and must train; the other is refused.
[ "$code_a" -eq 0 ] || [ "$code_b" -eq 0 ] || fail "neither job trained (exit $code_a and $code_b)"
# A node that joined the other job's rendezvous trains without its own partner: a job
# that started training must have started it on both of its nodes.
for out in job-a job-b; do
  started=$(grep -c "job .* node [01] start" "$work/out/$out.out" || true)
  [ "$started" -eq 0 ] || [ "$started" -eq 2 ] || fail "$out: one node trained in the other job's rendezvous"
done
# The refused job's nodes reached the other job's leader (same host, same port): it must
# refuse them at the handshake naming their job (their token, derived from the job id,
# differs), never let them join and turn them away later.
grep -q "this node is of job slurm-.*but the leader serves another job" "$work/out"/job-*.out ||
  fail "no node was refused by job id: $(grep -h "error" "$work/out"/job-*.out | head -n 5)"
! grep -q "the rendezvous is already closed" "$work/out"/job-*.out ||
  fail "a node of one job joined the other job's rendezvous before it was turned away"
if grep -q "Address already in use" "$work/out"/job-*.out; then
  grep -q -- "--exclusive" "$work/out"/job-*.out || fail "the port in use does not name the fix"
fi
echo "two jobs on shared nodes: no crossed rendezvous"

# --- 5. scancel leaves nothing behind --------------------------------------------------
cancel_seconds="9$$"  # a sleep no other process on this machine runs
jobid=$(sbatch --parsable --job-name="$tag" -N2 -o "$work/out/cancel.out" --wrap \
  "TRAIN_SECONDS=$cancel_seconds srun --ntasks-per-node=1 $BIN run --config $work/job.json --root $work/root")
deadline=$((SECONDS + 60))
until grep -q "node 1 start" "$work/out/cancel.out" 2>/dev/null; do
  [ $SECONDS -lt $deadline ] || fail "the job to cancel never started"
  sleep 0.3
done
scancel "$jobid"
deadline=$((SECONDS + 20))
while pgrep -f "sleep $cancel_seconds" >/dev/null || pgrep -f "$BIN run --config $work/job.json" >/dev/null ||
  pgrep -f "slurmstepd: \[$jobid" >/dev/null; do
  [ $SECONDS -lt $deadline ] || fail "processes of job $jobid outlived scancel by 20 s: $(pgrep -af "sleep $cancel_seconds|slurmstepd")"
  sleep 0.2
done
echo "scancel: nothing left"

# --- 6. examples/slurm/train.sbatch, as its comment says to submit it -----------------
# Adapted only where this machine differs from a GPU cluster: no GPU GRES (its
# --gpus-per-node line is dropped), two CPU workers per node instead of one per GPU,
# bt-launch on PATH. job.json is used as it is: real torchrun, gloo workers, checkpoints
# in the node's /scratch uploaded to the shared /shared.
if ! /usr/bin/python3 -c 'import torch.distributed' 2>/dev/null || ! command -v torchrun >/dev/null; then
  echo "SKIPPED part: examples/slurm/train.sbatch needs torchrun (Debian's python3-torch)"
  echo "PASS"
  exit 0
fi
mkdir -p "$work/bin" "$work/project"
ln -s "$BIN" "$work/bin/bt-launch"
grep -v -- '--gpus-per-node' "$SOURCE_DIR/examples/slurm/train.sbatch" > "$work/train.sbatch"
# The user's train.py: every worker checks a gloo all_reduce across both nodes; each
# node's first worker saves checkpoint-1 (trainer_state.json last, as the Trainer does).
cat > "$work/project/train.py" <<'PY'
import json, os
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(total)
world = dist.get_world_size()
assert total.item() == world * (world + 1) / 2, total
print(f"all_reduce rank {dist.get_rank()}/{world}: {total.item()}", flush=True)
if int(os.environ["LOCAL_RANK"]) == 0:
    path = os.path.join(os.environ["BT_CHECKPOINT_DIR"], "checkpoint-1")
    os.makedirs(path, exist_ok=True)
    torch.save({"node": os.environ["BT_NODE_RANK"]}, os.path.join(path, "pytorch_model.bin"))
    with open(os.path.join(path, "trainer_state.json"), "w") as state:
        json.dump({"global_step": 1}, state)
dist.barrier()
dist.destroy_process_group()
PY
jobid=$(cd "$work/project" && PATH="$work/bin:$PATH" NPROC_PER_NODE=2 OMP_NUM_THREADS=1 \
  BT_CONFIG="$SOURCE_DIR/examples/slurm/job.json" \
  sbatch --parsable --job-name="$tag" --time=5 -o "$work/out/train-sbatch.out" "$work/train.sbatch")
wait_job_end "$jobid" 180
[ "$(job_exit_code "$jobid")" = 0:0 ] || fail "train.sbatch: $(job_state "$jobid")"
reduced=$(grep -c "all_reduce rank [0-3]/4: 10.0" "$work/out/train-sbatch.out" || true)
[ "$reduced" -eq 4 ] || fail "train.sbatch: $reduced of 4 workers completed the all_reduce"
# What reached /shared, re-hashed against its manifests, both nodes' parts.
timeout 60 "$BIN" checkpoints --destination "file://$work/shared/checkpoints" --job-id "slurm-$jobid" --verify \
  --format json >"$work/out/train-listing.json" 2>"$work/out/train-listing.log" ||
  fail "train.sbatch: checkpoints --verify: $(cat "$work/out/train-listing.log")"
/usr/bin/python3 - "$work/out/train-listing.json" <<'PY' || fail "train.sbatch: $(cat "$work/out/train-listing.json")"
import json, sys
listing = json.load(open(sys.argv[1]))
assert listing["latest"] == "checkpoint-1", listing
assert {(c["name"], c["rank"]) for c in listing["checkpoints"] if c["verified"]} == {("checkpoint-1", 0), ("checkpoint-1", 1)}, listing
PY
echo "train.sbatch: 2 nodes x 2 gloo workers, checkpoint-1 committed to /shared, ExitCode=0:0"
echo "PASS"
