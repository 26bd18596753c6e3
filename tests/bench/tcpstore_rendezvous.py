#!/usr/bin/python3
"""The peer of `bt-launch bench rendezvous`: the same pattern on torch's TCPStore.

Node 0 is a separate process hosting the TCPStore server (as torchrun's agent on node 0
does). This process plays nodes 1..N-1 with one thread per node, all started together
(TCPStore clients block, so concurrency needs threads). Two shapes:
  protocol: connect, publish ~2 KiB of node info and count itself in (join); wait until
            every node is in (complete); a barrier (add, the last one sets the flag,
            everyone waits for it); report and wait for the result (exit).
  run:      what `bt-launch bench rendezvous` (its default, run-shaped) does between the
            join and the exit, on TCPStore: after complete, publish ~4 KiB of fabric
            inventory and count it; node 0's agent (a client thread in the server's
            process) reads every inventory once all are counted, parses them and sets a
            ~200 B plan; every node reads the plan and counts itself a reader (fabric);
            publishes its phase and counts itself ready, and node 0 opens the barrier
            once all are (ready); then the exit. No heartbeats (TCPStore has none).
Prints the same table as bt-launch's and, last, one JSON line.
Usage: tcpstore_rendezvous.py NODES [RUNS] [protocol|run]
"""
import datetime
import json
import statistics
import subprocess
import sys
import threading
import time

import torch
import torch.distributed as dist

TIMEOUT = datetime.timedelta(seconds=600)
PHASES = {"protocol": ("join", "complete", "barrier", "exit"), "run": ("join", "complete", "fabric", "ready", "exit")}

LEADER = r"""
import datetime, json, sys, threading, torch.distributed as dist
count, port, shape = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
timeout = datetime.timedelta(seconds=600)
store = dist.TCPStore("127.0.0.1", port, count, True, timeout, wait_for_workers=False)

def node_zero():
    # Node 0's agent: the plan from every inventory, then the ready barrier.
    agent = dist.TCPStore("127.0.0.1", port, count, False, timeout, wait_for_workers=False)
    agent.wait(["fabric/all-published"])
    rails = set()
    for rank in range(1, count):
        inventory = json.loads(agent.get(f"fabric/inventory/{rank}"))
        rails.update(port["rail"] for port in inventory["ports"])
    plan = {"transport": "ib", "rails": sorted(rails), "nccl": {"NCCL_IB_HCA": ",".join(f"mlx5_{r}" for r in sorted(rails))},
            "nodes": count}
    agent.set("fabric/plan", json.dumps(plan))
    agent.wait(["ready/all-counted"])
    agent.set("ready/all", "1")

if shape == "run":
    threading.Thread(target=node_zero, daemon=True).start()
print("ready", flush=True)
sys.stdin.readline()  # serve until the bench is done
"""


def node_info(rank):
    info = {"rank": rank, "host": f"bench-node-{rank}.cluster.example.internal", "pid": 1, "addresses": []}
    i = 0
    while len(json.dumps(info)) < 2048:
        info["addresses"].append(f"ib{i}=10.{i}.{rank // 256 % 256}.{rank % 256},fd00:{i}::{rank}")
        i += 1
    return json.dumps(info)


def inventory(rank):
    """About 4 KiB of JSON, as bt-launch's MessagePack inventory of the 8-rail fixture."""
    ports = [{"device": f"mlx5_{rail}", "port": 1, "rail": rail, "state": "ACTIVE", "link_layer": "InfiniBand",
              "rate": "400 Gb/sec (4X NDR)", "lid": rank % 65536, "guid": f"0x{rank:08x}{rail:08x}",
              "gids": [f"fe80:0000:0000:0000:{rank:04x}:{rail:04x}:0000:0001"], "netdev": f"ib{rail}",
              "numa_node": rail // 4, "pci": f"0000:{rail + 16:02x}:00.0"} for rail in range(8)]
    info = {"rank": rank, "host": f"bench-node-{rank}.cluster.example.internal", "ports": ports, "padding": ""}
    info["padding"] = "x" * max(0, 4096 - len(json.dumps(info)))
    return json.dumps(info)


def counted(store, key, count, flag):
    """Counts this node in; the last of the N-1 sets `flag`."""
    if store.add(key, 1) == count - 1:
        store.set(flag, "1")


def play(rank, count, port, start_gate, finished, lock, shape):
    start_gate.wait()
    while True:
        try:
            store = dist.TCPStore("127.0.0.1", port, count, False, TIMEOUT, wait_for_workers=False)
            break
        except RuntimeError:
            time.sleep(0.1)
    store.set(f"node/{rank}", node_info(rank))
    counted(store, "joined", count, "complete")
    mark(finished, 0, lock)
    store.wait(["complete"])
    mark(finished, 1, lock)
    if shape == "run":
        store.set(f"fabric/inventory/{rank}", inventory(rank))
        counted(store, "fabric/published", count, "fabric/all-published")
        json.loads(store.get("fabric/plan"))
        store.add("fabric/plan/readers", 1)
        mark(finished, 2, lock)
        store.set(f"phase/{rank}", "ready")
        counted(store, "ready", count, "ready/all-counted")
        store.wait(["ready/all"])
    else:
        counted(store, "barrier", count, "barrier-done")
        store.wait(["barrier-done"])
    mark(finished, len(PHASES[shape]) - 2, lock)
    counted(store, "done", count, "result")
    store.wait(["result"])
    mark(finished, len(PHASES[shape]) - 1, lock)


def mark(finished, phase, lock):
    with lock:
        finished[phase].append(time.monotonic())


def run(count, port, shape):
    leader = subprocess.Popen([sys.executable, "-c", LEADER, str(count), str(port), shape], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    leader.stdout.readline()  # torch imported and the server listening: the clock starts now
    gate = threading.Barrier(count)  # every thread exists before any node starts
    finished = [[] for _ in PHASES[shape]]
    lock = threading.Lock()
    threads = [threading.Thread(target=play, args=(rank, count, port, gate, finished, lock, shape), daemon=True)
               for rank in range(1, count)]
    for thread in threads:
        thread.start()
    start = time.monotonic()
    gate.wait()
    for thread in threads:
        thread.join()
    leader.stdin.close()
    leader.wait()
    return [max(times) - start for times in finished]


def main():
    count = int(sys.argv[1])
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    shape = sys.argv[3] if len(sys.argv) > 3 else "protocol"
    phases = PHASES[shape]
    threading.stack_size(256 * 1024)
    print(f"{'nodes':<6} {'run':<4} " + " ".join(f"{p + '_s':>10}" for p in phases))
    results = []
    for index in range(runs):
        figures = run(count, 29600 + index, shape)
        results.append(figures)
        print(f"{count:<6} {index + 1:<4} " + " ".join(f"{f:10.3f}" for f in figures), flush=True)
    summary = {"nodes": count, "runs": runs, "peer": "torch " + torch.__version__ + " TCPStore", "shape": shape,
               "p50_s": statistics.median(r[-1] for r in results)}
    for i, phase in enumerate(phases):
        summary[f"{phase}_p50_s"] = statistics.median(r[i] for r in results)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
