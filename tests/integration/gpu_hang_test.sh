#!/usr/bin/env bash
# A hang on the GPUs of one node, in NCCL itself: torchrun, one worker a GPU; at step 11 the
# last rank's GPU spins in a kernel (torch.cuda._sleep) ahead of its all_reduce, so that
# all_reduce is scheduled and never completes while the host waits for it (and with several
# GPUs the other ranks wait in theirs). Asserts that the hang is found; that every rank's
# NCCL flight recorder was dumped at bt-launch's request, minutes before NCCL's own timeout
# would have, and the report shows each rank's last collectives with step 11's all_reduce
# not completed; that the Python stack names the stuck function; and that the launcher
# exits 124. SKIPPED (77) without a GPU or a PyTorch with CUDA and NCCL (CI has neither:
# run it where the hardware is).
#   [KEEP_REPORT=FILE] tests/integration/gpu_hang_test.sh BT_LAUNCH
set -euo pipefail
BIN=$(realpath "$1")
[ -e /dev/nvidia0 ] || { echo "SKIPPED: no GPU (/dev/nvidia0 absent)"; exit 77; }
gpus=$(python3 -c 'import torch, torch.distributed as d; assert d.is_nccl_available(); print(torch.cuda.device_count())' 2>/dev/null) ||
  { echo "SKIPPED: python3 has no PyTorch with CUDA and NCCL"; exit 77; }
[ "$gpus" -ge 1 ] || { echo "SKIPPED: PyTorch sees no GPU"; exit 77; }
work=$(mktemp -d /tmp/bt-gpu-hang.XXXXXX)
launcher=
cleanup() {
  [ -z "$launcher" ] || kill -9 "$launcher" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  tail -n 80 "$work/job.log"
  find "$work/root" -path '*nccl-trace*' -exec ls -la {} + 2>/dev/null || true
  exit 1
}
stall_timeout_s=5

cat >"$work/train.py" <<'PY'
import os, time
import torch
import torch.distributed as dist

def stuck_on_the_gpu(x):
    torch.cuda._sleep(1 << 40)  # a kernel that spins for minutes
    dist.all_reduce(x)          # queued behind it: scheduled, never completed
    return x.cpu()              # the host waits here

def main():
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    x = torch.ones(1 << 20, device="cuda")
    for step in range(1, 1000):
        if step == 11 and rank == world - 1:
            print(f"rank {rank} hangs at step {step}", flush=True)
            stuck_on_the_gpu(x)
        x.fill_(1.0)
        dist.all_reduce(x)
        print(f"rank {rank} step {step} sum {x[0].item():.0f}", flush=True)
        time.sleep(0.1)

main()
PY
cat >"$work/job.json" <<JSON
{
  "compute": {"node_count": 1},
  "enable_baseten_workdir": false,
  "runtime": {"start_commands": ["python3 -m torch.distributed.run --standalone --nproc_per_node=$gpus $work/train.py"]},
  "launcher": {"grace_period_s": 5,
               "watchdog": {"stall_timeout_s": $stall_timeout_s, "startup_timeout_s": 180, "stack_timeout_s": 20}}
}
JSON

timeout -k 10 300 "$BIN" run --config "$work/job.json" --root "$work/root" >"$work/job.log" 2>&1 &
launcher=$!
code=0
wait "$launcher" || code=$?
launcher=
grep -q "hangs at step 11" "$work/job.log" || fail "rank $((gpus - 1)) never reached step 11"
[ "$code" -eq 124 ] || fail "bt-launch exited $code, expected 124 (a hang)"
report=$(find "$work/root" -name 'hang-*-cycle-0.txt' | head -n 1)
[ -n "$report" ] || fail "no hang report under $work/root"
[ -z "${KEEP_REPORT:-}" ] || cp "$report" "$KEEP_REPORT"  # KEEP_REPORT=FILE: the report outlives the test
echo "== the report's flight-recorder part"
sed -n '/NCCL flight recorder/,/^$/p' "$report"
grep -q "NCCL flight recorder: $gpus rank(s) asked for a dump; $gpus dump(s)" "$report" ||
  fail "not every rank's flight recorder was asked for and dumped"
grep -Eq "#11 nccl:all_reduce (scheduled|started)" "$report" || fail "step 11's all_reduce is not shown unfinished"
grep -q "#10 nccl:all_reduce completed" "$report" || fail "step 10's all_reduce is not shown completed"
grep -q "in stuck_on_the_gpu" "$work/job.log" || fail "the summary does not name stuck_on_the_gpu"
echo "PASS: a hang in NCCL on $gpus GPU(s): found, every flight recorder dumped and read, exit 124"
