#!/usr/bin/env bash
# The real NVML path (issue 30): `bt-launch doctor` on a machine with NVIDIA GPUs loads the
# driver's libnvidia-ml.so.1, reads every GPU (count, UUID, PCI bus id, ECC, row remapping,
# clocks event reasons, PCIe, NVLink) and finds nothing fatal on a healthy GPU. The readings
# are printed for docs/HEALTH.md. SKIPPED (77) without a GPU or the driver's NVML library (CI
# has neither: run it where the hardware is).
#   tests/integration/gpu_health_test.sh BT_LAUNCH
set -euo pipefail
BIN=$(realpath "$1")
[ -e /dev/nvidia0 ] || { echo "SKIPPED: no GPU (/dev/nvidia0 absent)"; exit 77; }
ldconfig -p 2>/dev/null | grep -q 'libnvidia-ml.so.1' || [ -n "${BT_NVML_LIBRARY:-}" ] ||
  { echo "SKIPPED: the driver's libnvidia-ml.so.1 is not installed"; exit 77; }
work=$(mktemp -d /tmp/bt-gpu-health.XXXXXX)
trap 'rm -rf "$work"' EXIT
report="$work/doctor.json"
timeout -s KILL 120 "$BIN" doctor --format json --root "$work/root" > "$report" 2> "$work/doctor.err" || true
python3 - "$report" <<'PY'
import json, sys
findings = json.load(open(sys.argv[1]))["findings"]
gpus = [f for f in findings if f["check"].startswith("gpu ") and f["check"] != "gpu health"]
health = [f for f in findings if f["check"] == "gpu health"]
for finding in gpus + health:
    print("%-12s %-5s %s" % (finding["check"], finding["verdict"], finding["detail"]))
assert gpus, "no GPU read through NVML"
assert all("ECC uncorrected" in f["detail"] and "PCIe Gen" in f["detail"] for f in gpus), "readings missing"
fatal = [f for f in health if f["verdict"] == "fail"]
assert not fatal, "a healthy GPU gave a fatal finding: %s" % fatal
print("PASS: %d GPU(s) read through the real NVML, no fatal finding" % len(gpus))
PY
