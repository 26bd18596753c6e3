#!/usr/bin/python3
"""The peer of `bt-launch bench rendezvous`: the same pattern on torch's TCPStore.

Node 0 is a separate process hosting the TCPStore server (as torchrun's agent on node 0
does). This process plays nodes 1..N-1 with one thread per node, all started together
(TCPStore clients block, so concurrency needs threads): connect, publish ~2 KiB of node
info and count itself in (join); wait until every node is in (complete); a barrier (add,
the last one sets the flag, everyone waits for it); report and wait for the result
(exit). Prints the same table as bt-launch's and, last, one JSON line.
Usage: tcpstore_rendezvous.py NODES [RUNS]
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
PHASES = ("join", "complete", "barrier", "exit")

LEADER = r"""
import datetime, sys, torch.distributed as dist
count, port = int(sys.argv[1]), int(sys.argv[2])
store = dist.TCPStore("127.0.0.1", port, count, True, datetime.timedelta(seconds=600), wait_for_workers=False)
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


def play(rank, count, port, start_gate, finished, lock):
    start_gate.wait()
    while True:
        try:
            store = dist.TCPStore("127.0.0.1", port, count, False, TIMEOUT, wait_for_workers=False)
            break
        except RuntimeError:
            time.sleep(0.1)
    store.set(f"node/{rank}", node_info(rank))
    if store.add("joined", 1) == count - 1:
        store.set("complete", "1")
    mark(finished, 0, lock)
    store.wait(["complete"])
    mark(finished, 1, lock)
    if store.add("barrier", 1) == count - 1:
        store.set("barrier-done", "1")
    store.wait(["barrier-done"])
    mark(finished, 2, lock)
    if store.add("done", 1) == count - 1:
        store.set("result", "0")
    store.wait(["result"])
    mark(finished, 3, lock)


def mark(finished, phase, lock):
    with lock:
        finished[phase].append(time.monotonic())


def run(count, port):
    leader = subprocess.Popen([sys.executable, "-c", LEADER, str(count), str(port)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    leader.stdout.readline()  # torch imported and the server listening: the clock starts now
    gate = threading.Barrier(count)  # every thread exists before any node starts
    finished = [[] for _ in PHASES]
    lock = threading.Lock()
    threads = [threading.Thread(target=play, args=(rank, count, port, gate, finished, lock), daemon=True)
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
    threading.stack_size(256 * 1024)
    print(f"{'nodes':<6} {'run':<4} " + " ".join(f"{p + '_s':>10}" for p in PHASES))
    results = []
    for index in range(runs):
        figures = run(count, 29600 + index)
        results.append(figures)
        print(f"{count:<6} {index + 1:<4} " + " ".join(f"{f:10.3f}" for f in figures), flush=True)
    summary = {"nodes": count, "runs": runs, "peer": "torch " + torch.__version__ + " TCPStore",
               "p50_s": statistics.median(r[-1] for r in results)}
    for i, phase in enumerate(PHASES):
        summary[f"{phase}_p50_s"] = statistics.median(r[i] for r in results)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
