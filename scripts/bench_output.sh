#!/usr/bin/env bash
# Job output through the launcher (issue 21): a job writing SIZE bytes as fast as it can,
# run directly, under tini, with its stdout through a plain pipe (`| cat`: what any pipe
# between the job and its destination costs), under the output relay (build/tests/relay_run:
# `bt-launch run` reduced to its supervision, given a watchdog::Progress) and under
# `bt-launch run` as built (the watchdog on, so the relay too), round-robin so that machine
# noise hits all alike. Jobs: `cat` of a file (nothing
# but writes: the relay's worst case per byte), `base64` of random bytes (76-byte lines),
# python print()ing numbered lines (a training log, far faster than any real one), block-
# buffered ("print") and with PYTHONUNBUFFERED=1 ("print-unbuffered": one write per line,
# the relay's worst case per write, and common in training images). Destinations:
# a file, and a pipe to `cat > /dev/null` (a container runtime's log pipe). Figures: median
# wall time, and CPU time (wait4's rusage of the contender and all it ran).
# Then what the relay adds to starting a job: `relay_run -- /bin/true` with and without
# the relay, STARTS times each, interleaved (the PID-1 figure against tini is
# scripts/bench.sh's). Prints a table, then one JSON line with the ratios to the direct run.
#   RUNS=5 SIZE=100000000 JOBS="cat base64 print print-unbuffered" STARTS=500 BUILD_DIR=build
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
if [ ! -x "$build/tests/relay_run" ] || [ ! -x "$build/launcher/bt-launch" ]; then
  BUILD_DIR=$build BUILD_TARGETS="bt-launch relay_run" ./scripts/build.sh >/dev/null
fi
tini=$(command -v tini || true)
work=$(mktemp -d /tmp/bt-output-bench.XXXXXX)
trap 'rm -rf "$work"' EXIT

/usr/bin/python3 - "$build" "$tini" "$work" "${RUNS:-5}" "${SIZE:-100000000}" "${JOBS:-cat base64 print print-unbuffered}" "${STARTS:-500}" <<'PY'
import json, os, statistics, subprocess, sys, time

build, tini, work, runs, size, jobs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6].split()
starts = int(sys.argv[7])
data = os.path.join(work, "data")
with open(data, "wb") as f:  # SIZE bytes of base64 lines, for `cat`
    subprocess.run(f"head -c {size * 3 // 4} /dev/urandom | base64 | head -c {size}", shell=True, stdout=f, check=True)
printer = (f"/usr/bin/python3 -c 'n = 0\ntotal = 0\nwhile total < {size}:\n"
           f"    line = \"step %d loss %.4f\" % (n, 1.0 / (n + 1))\n    print(line)\n"
           f"    total += len(line) + 1\n    n += 1'")
commands = {
    "cat": f"cat {data}",
    "base64": f"head -c {size * 3 // 4} /dev/urandom | base64",
    "print": "env -u PYTHONUNBUFFERED " + printer,
    "print-unbuffered": "PYTHONUNBUFFERED=1 " + printer,
}
contenders = {"direct": []}
if tini:
    contenders["tini"] = [tini, "-s", "--"]
contenders["| cat"] = ["/bin/sh", "-c", '"$@" | cat', "pipe"]
contenders["relay"] = [os.path.join(build, "tests", "relay_run"), "--"]
contenders["bt-launch run"] = [os.path.join(build, "launcher", "bt-launch"), "run", "--root", os.path.join(work, "root"), "--"]

def run_once(prefix, job, destination):
    argv = prefix + ["/bin/sh", "-c", commands[job]]
    out_path = os.path.join(work, "out")
    start = time.monotonic()
    if destination == "file":
        with open(out_path, "wb") as out, open(os.path.join(work, "err"), "wb") as err:
            process = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        consumer = None
    else:
        read_end, write_end = os.pipe()
        with open(os.path.join(work, "err"), "wb") as err:
            process = subprocess.Popen(argv, stdout=write_end, stderr=err, stdin=subprocess.DEVNULL)
        consumer = subprocess.Popen(["cat"], stdin=read_end, stdout=subprocess.DEVNULL)
        os.close(read_end)
        os.close(write_end)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = 0
    if consumer is not None:
        consumer.wait()
    wall = time.monotonic() - start
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{prefix[:1]} {job} failed: {status}")
    written = os.path.getsize(out_path) if destination == "file" else None
    if written is not None and written < size * 0.99:
        sys.exit(f"{prefix[:1]} {job}: only {written} bytes")
    if destination == "file":
        os.remove(out_path)
    return wall, usage.ru_utime + usage.ru_stime

results = {}
for job in jobs:
    for destination in ("file", "pipe"):
        figures = {name: ([], []) for name in contenders}
        for name, prefix in contenders.items():  # warm the page cache
            run_once(prefix, job, destination)
        for _ in range(runs):
            for name, prefix in contenders.items():
                wall, cpu = run_once(prefix, job, destination)
                figures[name][0].append(wall)
                figures[name][1].append(cpu)
        results[f"{job}/{destination}"] = {name: (statistics.median(w), statistics.median(c)) for name, (w, c) in figures.items()}

print(f"{size} bytes per job, median of {runs} runs (interleaved); wall seconds, CPU seconds of the contender and all it ran")
print(f"{'job/destination':22} {'contender':14} {'wall_s':>8} {'x direct':>9} {'cpu_s':>8} {'x direct':>9}")
summary = {"size": size, "runs": runs}
for key, by_name in results.items():
    direct_wall, direct_cpu = by_name["direct"]
    for name, (wall, cpu) in by_name.items():
        print(f"{key:22} {name:14} {wall:8.3f} {wall / direct_wall:9.3f} {cpu:8.3f} {cpu / direct_cpu:9.3f}")
        if name != "direct":
            summary[f"{key} {name} wall_ratio"] = round(wall / direct_wall, 3)
    summary[f"{key} direct_s"] = round(direct_wall, 3)
print("goal: relay wall_ratio <= 1.1")

# Starting a job: the relay's pipes and thread, against none.
relay_run = os.path.join(build, "tests", "relay_run")
start_figures = {"off": [], "on": []}
for _ in range(starts):
    for mode, extra in (("off", ["--no-relay"]), ("on", [])):
        begin = time.monotonic()
        subprocess.run([relay_run] + extra + ["--", "/bin/true"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        start_figures[mode].append((time.monotonic() - begin) * 1e6)
off, on = statistics.median(start_figures["off"]), statistics.median(start_figures["on"])
print(f"relay_run -- /bin/true, median of {starts}: relay off {off:.0f} us, on {on:.0f} us, the relay adds {on - off:.0f} us")
summary["start_relay_off_us"] = round(off)
summary["start_relay_on_us"] = round(on)
print(json.dumps(summary))
PY
