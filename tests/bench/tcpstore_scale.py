#!/usr/bin/python3
"""The peer of rendezvous_scale.cpp: N nodes rendezvous through torch's TCPStore.

Node 0 is a separate process hosting the TCPStore server (as torchrun's agent on node 0
does) and joining as rank 0; this process plays nodes 1..N-1 from one thread: connect,
publish the node's info, count itself in, wait until everyone is in; then count itself
done and wait for the result. Debian's python3-torch (1.13) has the poll-based server.
Usage: tcpstore_scale.py NODES...
"""
import datetime
import json
import subprocess
import sys
import time

import torch.distributed as dist

TIMEOUT = datetime.timedelta(seconds=600)

LEADER = r"""
import datetime, json, sys, torch.distributed as dist
count, port = int(sys.argv[1]), int(sys.argv[2])
store = dist.TCPStore("127.0.0.1", port, count, True, datetime.timedelta(seconds=600), wait_for_workers=False)
print("ready", flush=True)
store.set("node/0", json.dumps({"rank": 0, "host": "leader"}))
if store.add("joined", 1) == count:
    store.set("complete", "1")
store.wait(["complete"])
if store.add("done", 1) == count:
    store.set("result", "0")
store.wait(["result"])
# keep serving until every node has read the result
if store.add("bye", 1) < count:
    store.wait(["all-gone"])
"""


def run(count, port):
    leader = subprocess.Popen([sys.executable, "-c", LEADER, str(count), str(port)], stdout=subprocess.PIPE, text=True)
    leader.stdout.readline()  # "ready": the clock starts once torch is imported and the server listens
    start = time.monotonic()
    stores = []
    for rank in range(1, count):
        while True:
            try:
                store = dist.TCPStore("127.0.0.1", port, count, False, TIMEOUT, wait_for_workers=False)
                break
            except RuntimeError:
                time.sleep(0.001)
        store.set(f"node/{rank}", json.dumps({"rank": rank, "host": f"bench-host-{rank}"}))
        if store.add("joined", 1) == count:
            store.set("complete", "1")
        stores.append(store)
    joined = time.monotonic()
    for store in stores:
        store.wait(["complete"])
    complete = time.monotonic()
    for store in stores:
        if store.add("done", 1) == count:
            store.set("result", "0")
    for index, store in enumerate(stores):
        store.wait(["result"])
        if store.add("bye", 1) == count:
            store.set("all-gone", "1")
    result = time.monotonic()
    leader.kill()  # the result is in; the leader's shutdown is not timed
    leader.wait()
    stores.clear()
    print(f"{count:<8} {joined - start:12.3f} {complete - start:14.3f} {result - start:12.3f} "
          f"{(complete - start) * 1e6 / count:14.1f} {'killed':>8}", flush=True)


def main():
    counts = [int(arg) for arg in sys.argv[1:]] or [1024, 4096]
    print(f"{'nodes':<8} {'all_joined_s':>12} {'all_complete_s':>14} {'result_s':>12} {'per_node_us':>14} {'leader':>8}")
    for index, count in enumerate(counts):
        run(count, 29490 + index)


if __name__ == "__main__":
    main()
