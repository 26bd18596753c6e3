#!/usr/bin/env python3
"""The figures of scripts/bench_restart.sh: reads "launcher nodes output-dir" lines, prints a
table and, last, one JSON line. From the workers' stamps (tests/bench/restart_worker.py):
fault -> every other node's job stopped, fault -> every node's job started again; for
bt-launch also from its own log: the failed command logged -> every node's "job is stopped"
-> every node's cycle-1 "start command" line."""
import datetime
import glob
import json
import os
import re
import statistics
import sys


def stamps(out):
    found = []
    for path in glob.glob(os.path.join(out, "node*.out")):
        for line in open(path, errors="replace"):
            m = re.search(r"BENCH (\w+) node=(\d+) cycle=(\d+) t=([0-9.]+)", line)
            if m:
                found.append((m[1], int(m[2]), int(m[3]), float(m[4])))
    return found


def worker_figures(out, nodes):
    s = stamps(out)
    fault = [t for e, n, c, t in s if e == "fault"]
    stopped = {n: t for e, n, c, t in s if e == "stopped" and c == 0}
    again = {n: t for e, n, c, t in s if e == "start" and c == 1}
    if not fault or len(again) < nodes or len(stopped) < nodes - 1:
        return None
    return max(stopped.values()) - fault[0], max(again.values()) - fault[0]


def log_time(line):
    when = datetime.datetime.strptime(line[:23], "%Y-%m-%dT%H:%M:%S.%f")
    return when.replace(tzinfo=datetime.timezone.utc).timestamp()


def log_figures(out, nodes):
    fault, stopped, again = None, [], []
    for rank in range(nodes):
        starts = []
        for line in open(os.path.join(out, f"node{rank}.log"), errors="replace"):
            if "start command 1 exited with code 1" in line:
                fault = log_time(line)
            if "waiting for every node to be ready for cycle 1" in line:
                stopped.append(log_time(line))
            if "start command 1/1" in line:
                starts.append(log_time(line))
        if len(starts) > 1:
            again.append(starts[1])
    if fault is None or len(stopped) < nodes or len(again) < nodes:
        return None
    return max(stopped) - fault, max(again) - fault


def median_ms(values):
    values = [v for v in values if v is not None]
    return round(statistics.median(values) * 1000, 1) if values else None


def main():
    runs = {}
    for line in sys.stdin:
        launcher, nodes, out = line.split()
        nodes = int(nodes)
        logs = log_figures(out, nodes) if launcher == "bt-launch" else None
        runs.setdefault((launcher, nodes), []).append((worker_figures(out, nodes), logs))
    rows = []
    header = ("launcher", "nodes", "runs ok", "fault->all stopped ms", "fault->all restarted ms", "log: stopped ms",
              "log: restarted ms")
    print("{:18} {:>5} {:>8} {:>22} {:>24} {:>16} {:>18}".format(*header))
    for (launcher, nodes), results in sorted(runs.items(), key=lambda item: (item[0][1], item[0][0])):
        ok = [w for w, _ in results if w]
        logs = [l for _, l in results if l]
        row = {"launcher": launcher, "nodes": nodes, "runs": len(results), "runs_ok": len(ok),
               "fault_to_all_stopped_ms": median_ms([w[0] for w in ok]),
               "fault_to_all_restarted_ms": median_ms([w[1] for w in ok]),
               "log_fault_to_all_stopped_ms": median_ms([l[0] for l in logs]),
               "log_fault_to_all_restarted_ms": median_ms([l[1] for l in logs])}
        rows.append(row)
        print("{:18} {:>5} {:>8} {:>22} {:>24} {:>16} {:>18}".format(
            launcher, nodes, f"{len(ok)}/{len(results)}", str(row["fault_to_all_stopped_ms"]),
            str(row["fault_to_all_restarted_ms"]), str(row["log_fault_to_all_stopped_ms"]),
            str(row["log_fault_to_all_restarted_ms"])))
    ratios = {}
    for row in rows:
        ours = next((r for r in rows if r["launcher"] == "bt-launch" and r["nodes"] == row["nodes"]), None)
        if row["launcher"] == "bt-launch" or not ours:
            continue
        if ours["fault_to_all_restarted_ms"] and row["fault_to_all_restarted_ms"]:
            key = f"{row['launcher']}/bt-launch@{row['nodes']}"
            ratios[key] = round(row["fault_to_all_restarted_ms"] / ours["fault_to_all_restarted_ms"], 1)
    print(json.dumps({"bench": "restart", "rows": rows, "restarted_ratio": ratios}))


main()
