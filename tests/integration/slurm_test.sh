#!/usr/bin/env bash
# bt-launch under a real Slurm (Debian's slurm-wlm, munge): slurmctld in this namespace and
# four slurmd, each in its own network namespace (entered with `nsenter --net`: Debian's
# slurmd refuses `ip netns exec`, which hides /sys/fs/cgroup) with its own address, host
# name and /etc/hosts. Then what a cluster user does: a job whose node 1 fails (the job's
# code reaches srun and the controller), a step on nodes 3-4 of 4 (its own leader), two
# tasks per node (65, named), two jobs of one config sharing nodes (never one rendezvous),
# and scancel (nothing left). SKIPPED (77) where namespaces or the packages are missing;
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
work=$(mktemp -d /tmp/bt-slurm.XXXXXX)
chmod 755 "$work"
pids=()

cleanup() {
  scancel --quiet --full "--name=${tag}" 2>/dev/null || true
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  for i in $(seq 1 $kNodes); do
    for pid in $(ip netns pids "${tag}n$i" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "${tag}n$i" 2>/dev/null || true
  done
  ip link del "$bridge" 2>/dev/null || true
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

mkdir -p "$work/munge" "$work/state" "$work/out" "$work/root"
for i in $(seq 1 $kNodes); do mkdir -p "$work/spool-node0$i"; done
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
  # A mount namespace of its own for the node's /etc/hosts; UTS for its host name.
  nsenter --net="/run/netns/${tag}n$i" unshare --mount --uts sh -c \
    "mount --bind '$work/hosts' /etc/hosts && hostname node0$i && exec nice -n 19 slurmd -D -N node0$i -f '$SLURM_CONF'" \
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

# --- 1. the job's exit code reaches the scheduler --------------------------------------
code=0
step -N2 --ntasks-per-node=1 "$BIN" run --config job.json --root "$work/root" -- \
  sh -c '[ "$BT_NODE_RANK" = 1 ] && { sleep 0.5; exit 3; }; exec sleep 60' >"$work/out/exit.out" 2>&1 || code=$?
[ "$code" -eq 3 ] || fail "srun exited $code when node 1's training exited 3 (expected 3, the training's code)"
grep -q "exiting with node 1's exit code 3" "$work/out/exit.out" || fail "node 0 does not name node 1 as the source of its code"
jobid=$(sbatch --parsable --job-name="$tag" -N2 -o "$work/out/batch-exit.out" --wrap \
  "srun --ntasks-per-node=1 --kill-on-bad-exit=1 $BIN run --config $work/job.json --root $work/root -- sh -c '[ \"\$BT_NODE_RANK\" = 1 ] && exit 3; exec sleep 60'")
deadline=$((SECONDS + 90))
until scontrol show job "$jobid" | grep -qE "JobState=(FAILED|COMPLETED|CANCELLED|TIMEOUT)"; do
  [ $SECONDS -lt $deadline ] || fail "batch job $jobid did not end"
  sleep 0.5
done
scontrol show job "$jobid" | grep -q "ExitCode=3:0" || fail "batch job: $(scontrol show job "$jobid" | grep -o 'JobState=[A-Z]* .*ExitCode=[0-9:]*')"
echo "exit code: srun 3, batch job ExitCode=3:0"

# --- 2. a step on nodes 3-4 of 4 finds its own leader ----------------------------------
jobid=$(sbatch --parsable --job-name="$tag" -N4 -o "$work/out/step.out" --wrap \
  "srun -N2 --relative=2 $BIN rendezvous --config $work/job.json")
deadline=$((SECONDS + 90))
until scontrol show job "$jobid" | grep -qE "JobState=(FAILED|COMPLETED|CANCELLED|TIMEOUT)"; do
  [ $SECONDS -lt $deadline ] || fail "step job $jobid did not end"
  sleep 0.5
done
scontrol show job "$jobid" | grep -q "ExitCode=0:0" || fail "a step on nodes 3-4 failed: $(cat "$work/out/step.out")"
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
  started=$(grep -c "job slurm-[0-9.]* node [01] start" "$work/out/$out.out" || true)
  [ "$started" -eq 0 ] || [ "$started" -eq 2 ] || fail "$out: one node trained in the other job's rendezvous"
done
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
echo "PASS"
