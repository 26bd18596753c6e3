#!/usr/bin/env python3
"""One node's training in the restart benchmark (scripts/bench_restart.sh), the same under
bt-launch and under torchrun: it prints wall-clock stamps when it starts, when SIGTERM stops
it, and when it fails. Its first run on node BENCH_FAILING_NODE fails after
BENCH_FAULT_AFTER seconds; every later run is brief and succeeds. Which run this is comes
from a marker in BENCH_MARK_DIR, not from TORCHELASTIC_RESTART_COUNT: torchrun restarts the
nodes that did not fail without counting it (a membership change), so their count stays 0.
The node is BENCH_NODE (torchrun renumbers nodes at each rendezvous)."""
import os
import signal
import sys
import time

node = int(os.environ["BENCH_NODE"])
marker = os.path.join(os.environ["BENCH_MARK_DIR"], f"node{node}.started")
cycle = 1 if os.path.exists(marker) else 0
open(marker, "w").close()


def stamp(event):
    print(f"BENCH {event} node={node} cycle={cycle} t={time.time():.6f}", flush=True)


def on_term(signum, frame):
    stamp("stopped")
    sys.exit(128 + signum)


signal.signal(signal.SIGTERM, on_term)
stamp("start")
if cycle == 0 and node == int(os.environ.get("BENCH_FAILING_NODE", "1")):
    time.sleep(float(os.environ.get("BENCH_FAULT_AFTER", "2")))
    stamp("fault")
    sys.exit(1)
time.sleep(60 if cycle == 0 else 1)
