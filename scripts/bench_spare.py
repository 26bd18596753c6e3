#!/usr/bin/env python3
"""Hot spares against a replaced node (issue 30, point 5).

NODES (4) bt-launch nodes on loopback, each saving a PART_MIB (1024) MiB checkpoint part
committed to a file:// destination, then Xid 79 on GPU 3 of node 2 (the fake NVML the tests
build, driven by a state file). Measured, from the fault (the state file written) to every
rank training again (each rank's first line of cycle 1, stamped by the job itself, one host's
clock):
  - with one hot spare (launcher.spares 1): the spare takes rank 2 and loads its part;
  - without one: the others wait, and a replacement launcher starts in node 2's slot after
    SCHEDULER_DELAY_S (30: what a pod recreate costs).
FAILING_NODE=0 puts the fault on node 0 instead: rank 0 moves to the spare while node 0 keeps
serving the store (without a spare the job would end: only the spare is measured).
Median of RUNS (1). Prints a table, then one JSON line. KEEP=1 keeps the work directory.
  RUNS=1 NODES=4 PART_MIB=1024 SCHEDULER_DELAY_S=30 FAILING_NODE=2 BUILD_DIR=build ./scripts/bench_spare.sh
"""
import datetime
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, os.environ.get("BUILD_DIR", "build"))
BINARY = os.path.join(BUILD, "launcher", "bt-launch")
FAKE_NVML = os.path.join(BUILD, "tests", "fake_nvml", "libnvidia-ml.so.1")
NODES = int(os.environ.get("NODES", "4"))
PART_MIB = int(os.environ.get("PART_MIB", "1024"))
DELAY_S = float(os.environ.get("SCHEDULER_DELAY_S", "30"))
RUNS = int(os.environ.get("RUNS", "1"))
FAILING = int(os.environ.get("FAILING_NODE", "2"))
RUN_LIMIT_S = 600


def free_port():
    """A free port below the ephemeral range (never a client's source port)."""
    while True:
        port = random.randrange(20000, 32000)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
                return port
            except OSError:
                pass


def write_state(path, text):
    with open(path + ".tmp", "w") as out:
        out.write(text)
    os.rename(path + ".tmp", path)


def job_config(work, spares, port):
    latest = os.path.join(work, "remote", "spare-bench", "latest")
    go_on = os.path.join(work, "go-on")
    part = "$BT_CHECKPOINT_DIR/step-1"
    cycle0 = (f"mkdir -p {part} && head -c {PART_MIB * 1048576} /dev/zero > {part}/part.bin && "
              f"echo '{{}}' > {part}/trainer_state.json && "
              f"until [ -s {latest} ]; do sleep 0.1; done; echo training; exec sleep 600")
    cycle1 = (f"echo \"training again $(date +%s.%N) rank $BT_NODE_RANK "
              f"$(stat -c %s $BT_LOAD_CHECKPOINT_DIR/rank-$BT_NODE_RANK/step-1/part.bin)\"; "
              f"until [ -e {go_on} ]; do sleep 0.1; done")
    command = f'if [ "$BT_RESTART_COUNT" = 0 ]; then {cycle0}; else {cycle1}; fi'
    return {
        "compute": {"node_count": NODES},
        "enable_baseten_workdir": False,
        "runtime": {"start_commands": [command], "checkpointing_config": {"enabled": True}},
        "launcher": {
            "job_id": "spare-bench", "grace_period_s": 5, "peer_failure_grace_s": 5, "spares": spares,
            "master_port": port + 100,
            "rendezvous": {"port": port, "join_timeout_s": 120, "heartbeat_interval_s": 0.5, "heartbeat_timeout_s": 10,
                           "exit_barrier_timeout_s": 120},
            "restart": {"max_restarts": 2, "rejoin_timeout_s": 300},
            "health": {"interval_s": 1},
            "checkpoint": {"destination": "file://" + os.path.join(work, "remote"), "scan_interval_s": 0.5,
                           "quiet_period_s": 1, "drain_timeout_s": 120},
        },
    }


def launch(work, slot, launchers, tag, root="root"):
    state = os.path.join(work, f"nvml-{tag}")
    write_state(state, "gpus 4\ngpu 3 uuid GPU-bench-3\n")
    env = dict(os.environ, BT_NODE_RANK=str(slot), BT_GROUP_SIZE=str(launchers), BT_LEADER_ADDR="127.0.0.1",
               BT_RENDEZVOUS_TOKEN="spare-bench-token", BT_NVML_LIBRARY=FAKE_NVML, BT_FAKE_NVML_STATE=state)
    env.pop("BT_JOB_CONFIG", None)
    out = open(os.path.join(work, f"out-{tag}.log"), "w")
    err = open(os.path.join(work, f"err-{tag}.log"), "w")
    process = subprocess.Popen([BINARY, "run", "--config", os.path.join(work, "job.json"), "--root",
                                os.path.join(work, root)], env=env, stdout=out, stderr=err, start_new_session=True)
    return process, state


def wait_for(predicate, limit_s, what):
    deadline = time.time() + limit_s
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise RuntimeError("timed out waiting for " + what)


def text(path):
    try:
        with open(path, errors="replace") as source:
            return source.read()
    except FileNotFoundError:
        return ""


def logged_at(path, text_in_line):
    """The wall time of the first log line holding `text_in_line` (the launcher's UTC stamps)."""
    for line in text(path).splitlines():
        if text_in_line in line:
            stamp = datetime.datetime.strptime(line.split()[0], "%Y-%m-%dT%H:%M:%S.%fZ")
            return stamp.replace(tzinfo=datetime.timezone.utc).timestamp()
    return None


def one_run(spares):
    """Seconds from the fault to every rank's first line of cycle 1, and from the fault to the
    newcomer's load of rank 2's part starting and ending (the spare, or the replacement)."""
    work = tempfile.mkdtemp(prefix="bt-spare-bench.")
    processes = []
    try:
        port = free_port()
        with open(os.path.join(work, "job.json"), "w") as out:
            json.dump(job_config(work, spares, port), out)
        launchers = NODES + spares
        states = {}
        for slot in range(launchers):
            process, states[slot] = launch(work, slot, launchers, str(slot))
            processes.append(process)
        wait_for(lambda: all("training" in text(os.path.join(work, f"out-{s}.log")) for s in range(NODES)), RUN_LIMIT_S,
                 "every rank's checkpoint committed")
        fault = time.time()
        write_state(states[FAILING], "gpus 4\ngpu 3 uuid GPU-bench-3\nxid 1 3 79\n")
        if spares == 0:
            wait_for(lambda: processes[FAILING].poll() is not None, 60, "node 2 to leave")
            time.sleep(max(0.0, fault + DELAY_S - time.time()))  # the scheduler recreates the pod
            # A new host: nothing of the part on its disk (a root of its own).
            process, _ = launch(work, FAILING, NODES + spares, "replacement", "root-replacement")
            processes.append(process)
        outputs = [os.path.join(work, f"out-{s}.log") for s in range(launchers) if s != FAILING]
        if spares == 0:
            outputs.append(os.path.join(work, "out-replacement.log"))
        stamps = {}

        def every_rank_again():
            for path in outputs:
                for line in text(path).splitlines():
                    if line.startswith("training again"):
                        _, _, stamp, _, rank, size = line.split()
                        if int(size) != PART_MIB * 1048576:
                            raise RuntimeError(f"rank {rank} loaded {size} bytes of its part")
                        stamps[int(rank)] = float(stamp)
            return len(stamps) == NODES

        wait_for(every_rank_again, RUN_LIMIT_S, "every rank training again")
        newcomer = os.path.join(work, "err-replacement.log" if spares == 0 else f"err-{NODES}.log")
        took_rank = logged_at(newcomer, "this spare takes rank" if spares else "joined again" ) or logged_at(newcomer, "replaces a lost one")
        loaded = logged_at(newcomer, "loaded checkpoint step-1")
        open(os.path.join(work, "go-on"), "w").close()
        for process in processes:
            try:
                process.wait(timeout=180)
            except subprocess.TimeoutExpired:
                process.kill()
        return {"again": max(stamps.values()) - fault,
                "took_rank": (took_rank - fault) if took_rank else float("nan"),
                "load": (loaded - took_rank) if loaded and took_rank else float("nan")}
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        if os.environ.get("KEEP"):
            print("kept " + work, file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


def main():
    if not os.access(BINARY, os.X_OK) or not os.path.exists(FAKE_NVML):
        sys.exit(f"build first: {BINARY} and {FAKE_NVML} (BUILD_DIR)")
    spare = [one_run(1) for _ in range(RUNS)]
    # Node 0 cannot be replaced while the job runs (it serves the store): no comparison then.
    replaced = [one_run(0) for _ in range(RUNS)] if FAILING != 0 else []

    def median(runs, key):
        return statistics.median(run[key] for run in runs)

    with_spare = median(spare, "again")
    without = median(replaced, "again") if replaced else None
    print(f"{'setup (Xid 79 on node ' + str(FAILING) + ')':<46} {'fault -> rank taken':>20} {'its part loaded in':>19} "
          f"{'every rank training again':>26}")
    rows = [("1 hot spare (launcher.spares 1)", spare)]
    if replaced:
        rows.append((f"no spare, replacement after {int(DELAY_S)} s (pod recreate)", replaced))
    for name, runs in rows:
        print(f"{name:<46} {median(runs, 'took_rank'):>18.3f} s {median(runs, 'load'):>17.3f} s "
              f"{median(runs, 'again'):>24.3f} s")
    if without is not None:
        print(f"{'ratio (no spare / spare)':<46} {'':>20} {'':>19} {without / with_spare:>25.1f}x")
    print(json.dumps({"bench": "spare", "nodes": NODES, "part_mib": PART_MIB, "scheduler_delay_s": DELAY_S, "runs": RUNS,
                      "failing_node": FAILING, "spare_s": round(with_spare, 3),
                      "spare_took_rank_s": round(median(spare, "took_rank"), 3),
                      "spare_load_s": round(median(spare, "load"), 3),
                      "no_spare_s": round(without, 3) if without is not None else None,
                      "replacement_load_s": round(median(replaced, "load"), 3) if replaced else None,
                      "ratio": round(without / with_spare, 1) if without is not None else None}))


if __name__ == "__main__":
    main()
