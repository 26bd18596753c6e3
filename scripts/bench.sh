#!/usr/bin/env bash
# Benchmarks, each against a peer in the same run; figures go to docs/PERFORMANCE.md.
#   RUNS=N       PID-1 runs per command (default 2000)
#   NODES="..."  rendezvous sizes (default "1024 16384"); PEER_NODES for torch's TCPStore (1024)
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh
dpkg-query -W -f='${Status}' python3-torch 2>/dev/null | grep -q 'install ok installed' || {
  sudo_cmd=(); [ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends python3-torch
}
root=$(mktemp -d /tmp/bt-launch-bench.XXXXXX)
trap 'rm -rf "$root"' EXIT

echo "== PID 1 overhead: bt-launch vs tini vs plain exec"
# A copy, as `cmake --install` leaves it: the linker's own output file starts 0.1-0.3 ms
# slower on every exec than a copy of the same bytes (measured 2026-11-25, docs/PERFORMANCE.md),
# and users run a copy.
cp build/launcher/bt-launch "$root/bt-launch"
build/tests/pid1_overhead "$root/bt-launch" "$(command -v tini)" "$root" "${RUNS:-2000}"

echo "== one health sample (8 GPUs over the tests' fake NVML, 2 InfiniBand ports): CPU time against the 1 ms goal"
printf 'gpus 8\n' > "$root/nvml-state"
cp -a tests/fixtures/health/ib2-counters "$root/health-sysfs"
BT_FAKE_NVML_STATE="$root/nvml-state" build/tests/health_sample build/tests/fake_nvml/libnvidia-ml.so.1 \
  "$root/health-sysfs/sys" 1000

echo "== rendezvous of N nodes arriving together: bt-launch against torch's TCPStore"
RUNS=3 ./scripts/bench_rendezvous.sh
echo "== what the fabric check adds to a 64-node rendezvous"
RUNS=3 ./scripts/bench_fabric.sh
