#!/usr/bin/env python3
"""Crash-consistency harness for checkpoint handoff (docs/CHECKPOINTS.md, "Crash consistency").

A training saves, rotates and saves again checkpoints with awkward names (spaces, a
leading dash, bytes that are not UTF-8) and many small files, on one node or two, while
this harness SIGKILLs the launcher, the uploader or rclone at a random moment and starts
the launcher again on the same volume. After every round it checks the invariants:

  1. `bt-launch checkpoints --verify` passes: every committed version of every part
     matches its manifest byte for byte;
  2. `latest` and every commit record name, on every node, a save the training completed,
     and the same save on both nodes (never node 0's second save with node 1's first);
  3. every checkpoint complete before the last kill (and not rotated away) is committed
     after the restart, as its last completed save;
  4. nothing was written outside the destination and the job's directories (the work
     directory holds only them, and no bt-launch temporary is left in its TMPDIR, which
     the harness gives everything it starts).

Usage: checkpoint_crash_harness.py BT_LAUNCH file|s3
  SEED=n      replays a run (each run logs its seed)
  ROUNDS=n    rounds per node count (default 2); CRASH_SOAK=1 makes it 40, which outlasts
              ctest's 900 s TIMEOUT: run a soak with this script itself, e.g.
              CRASH_SOAK=1 python3 tests/integration/checkpoint_crash_harness.py build/launcher/bt-launch s3
"""
import hashlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

BIN = os.path.realpath(sys.argv[1])
MODE = sys.argv[2]
JOB = "crash-job"
BUCKET = "crash"
ROUND_TIMEOUT_S = 120
NAMES = [b"ckpt a", b"with space", b"-leading-dash", b"bytes-\xff\xfe", b"many-small"]

# The training every node runs, as a start command. Its state (the next save) lives in the
# harness's directory, so a restart continues the sequence; every save is recorded in the
# ledger once complete. Saving is collective, as in a distributed training: every node
# writes its part, then waits for the others' (a barrier), and node 0 writes the marker
# (markers are rank-0 files). Rotation removes the checkpoint saved two saves ago unless a
# later save reuses it.
TRAINING = r'''
import json, os, random, shutil, sys, time
harness, seed, first, saves = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rank = int(os.environ["BT_NODE_RANK"])
nodes = int(os.environ.get("BT_GROUP_SIZE", "1"))
root = os.fsencode(os.environ["BT_CHECKPOINT_DIR"])
names = [bytes.fromhex(n) for n in sys.argv[5:]]
state_path = os.path.join(harness, "state-%d" % rank)
ledger = os.path.join(harness, "ledger-%d.jsonl" % rank)
start = int(open(state_path).read()) if os.path.exists(state_path) else first
start = max(start, first)
def plan(save):
    r = random.Random(seed * 1000 + save)
    name = names[r.randrange(len(names))]
    many = name == b"many-small"
    files = [(b"shard-%03d.bin" % i, r.randrange(1, 3000)) for i in range(120 if many else r.randrange(1, 4))]
    if not many:
        files.append((b"weights.bin", r.randrange(10000, 600000)))
    return name, files, r.uniform(0.8, 1.3)
def barrier(save):
    open(os.path.join(harness, "barrier-%d-%d" % (save, rank)), "w").close()
    for _ in range(600):
        if all(os.path.exists(os.path.join(harness, "barrier-%d-%d" % (save, r))) for r in range(nodes)):
            return
        time.sleep(0.05)
    sys.exit("save %d: the other nodes never saved their parts" % save)
for save in range(start, first + saves):
    name, files, pause = plan(save)
    directory = os.path.join(root, name)
    marker = os.path.join(directory, b".complete")
    if os.path.exists(marker):
        os.unlink(marker)
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    for file_name, size in files:
        with open(os.path.join(directory, file_name), "wb") as f:
            f.write(os.urandom(size))
    with open(os.path.join(directory, b"id"), "w") as f:
        f.write("%d %d\n" % (save, rank))
    barrier(save)
    if rank == 0:
        open(marker, "w").close()
    with open(ledger, "a") as f:
        f.write(json.dumps({"save": save, "name": name.hex()}) + "\n")
    with open(state_path, "w") as f:
        f.write(str(save + 1))
    if save >= first + 2:
        old = plan(save - 2)[0]
        if old not in (name, plan(save - 1)[0]):
            shutil.rmtree(os.path.join(root, old), ignore_errors=True)
            with open(ledger, "a") as f:
                f.write(json.dumps({"rotated": old.hex(), "after": save}) + "\n")
    time.sleep(pause)
time.sleep(1)
'''


def log(*parts):
    print("[crash harness]", *parts, flush=True)


def free_port():
    # Below 32768, outside the ephemeral range the kernel hands out.
    for _ in range(200):
        port = random.randrange(20000, 32000)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise RuntimeError("no free port below 32768")


class Destination:
    """Reads the destination back: a directory (file://) or moto_server through rclone."""

    def __init__(self, work):
        self.work = work
        self.server = None
        self.env = {}
        if MODE == "file":
            self.uri = "file://" + os.path.join(work, "remote")
            return
        port = free_port()
        self.server = subprocess.Popen(["moto_server", "-H", "127.0.0.1", "-p", str(port)],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        endpoint = "http://127.0.0.1:%d" % port
        self.env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
                    "AWS_ENDPOINT_URL": endpoint}
        os.makedirs(os.path.join(work, "harness"), exist_ok=True)
        self.rclone_env = {"PATH": os.environ["PATH"], "HOME": os.path.join(work, "harness"), "RCLONE_CONFIG_H_TYPE": "s3",
                           "RCLONE_CONFIG_H_PROVIDER": "Other", "RCLONE_CONFIG_H_ACCESS_KEY_ID": "testing",
                           "RCLONE_CONFIG_H_SECRET_ACCESS_KEY": "testing", "RCLONE_CONFIG_H_ENDPOINT": endpoint,
                           "RCLONE_CONFIG_H_REGION": "us-east-1"}
        for _ in range(100):
            if subprocess.run(["rclone", "mkdir", "h:" + BUCKET], env=self.rclone_env,
                              capture_output=True, timeout=30).returncode == 0:
                break
            time.sleep(0.2)
        else:
            raise RuntimeError("moto_server did not start")
        self.uri = "s3://" + BUCKET + "/runs"

    def read(self, path):
        if MODE == "file":
            full = os.path.join(self.work, "remote", path)
            return open(full, "rb").read() if os.path.exists(full) else None
        result = subprocess.run(["rclone", "cat", "h:" + BUCKET + "/runs/" + path], env=self.rclone_env,
                                capture_output=True, timeout=60)
        return result.stdout if result.returncode == 0 and result.stdout else None

    def close(self):
        if self.server:
            self.server.kill()
            self.server.wait()


def descendants(pid):
    children = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            children.append(int(entry))
    return children + [grand for child in children for grand in descendants(child)]


def command_line(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read()
    except OSError:
        return b""


class Round:
    def __init__(self, work, destination, nodes, seed, number):
        self.work = work
        self.destination = destination
        self.nodes = nodes
        self.rng = random.Random(seed * 7919 + number)
        self.seed = seed * 100 + number
        self.harness = os.path.join(work, "harness")
        self.saves = self.rng.randrange(4, 7)
        self.first = number * 100  # save numbers unique across rounds: the ledger spans them

    def config(self):
        names = " ".join(n.hex() for n in NAMES)
        command = "python3 %s/train.py %s %d %d %d %s" % (self.harness, self.harness, self.seed, self.first, self.saves, names)
        config = {"runtime": {"start_commands": [command], "checkpointing_config": {"enabled": True}},
                  "launcher": {"job_id": JOB, "grace_period_s": 5,
                               "checkpoint": {"destination": self.destination.uri, "drain_timeout_s": 60,
                                              "scan_interval_s": 0.5, "quiet_period_s": 30}}}
        if self.nodes > 1:
            config["compute"] = {"node_count": self.nodes}
            config["launcher"]["rendezvous"] = {"port": free_port(), "join_timeout_s": 30, "heartbeat_interval_s": 0.2,
                                                "heartbeat_timeout_s": 3}
        path = os.path.join(self.harness, "job.json")
        with open(path, "w") as f:
            json.dump(config, f)
        return path

    def start(self):
        # The newest save the training made before these launchers start: with other nodes,
        # a launcher that starts again commits nothing of the run before it (the job resumes
        # from `latest` and saves again, docs/CHECKPOINTS.md), so those may stay uncommitted.
        saves, _ = ledger(self.work, 0)
        self.saved_before_last_start = max((max(numbers) for numbers in saves.values()), default=-1)
        config = self.config()
        environment = launcher_environment(self.work, self.destination)
        environment["BT_RENDEZVOUS_TOKEN"] = "crash-harness"
        launchers = []
        for rank in range(self.nodes):
            args = [BIN, "run", "--config", config, "--root", os.path.join(self.work, "root")]
            if self.nodes > 1:
                args += ["--node-rank", str(rank), "--node-count", str(self.nodes), "--leader-addr", "127.0.0.1"]
            out = open(os.path.join(self.harness, "launcher-%d.log" % rank), "ab")
            launchers.append(subprocess.Popen(args, env=environment, stdout=out, stderr=out))
        return launchers

    def kill_something(self, launchers):
        """SIGKILLs one launcher, uploader or rclone at a random moment; returns what."""
        time.sleep(self.rng.uniform(0.3, 3.0))
        rank = self.rng.randrange(self.nodes)
        launcher = launchers[rank]
        victims = {"launcher": [launcher.pid]}
        for pid in descendants(launcher.pid):
            line = command_line(pid)
            if b"upload-worker" in line:
                victims.setdefault("uploader", []).append(pid)
            elif line.startswith(b"rclone") or b"/rclone\0" in line:
                victims.setdefault("rclone", []).append(pid)
        what = self.rng.choice(sorted(victims))
        for pid in victims[what]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return "%s of node %d" % (what, rank)

    def wait(self, launchers):
        deadline = time.monotonic() + ROUND_TIMEOUT_S
        codes = []
        for launcher in launchers:
            try:
                codes.append(launcher.wait(timeout=max(1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                launcher.kill()
                codes.append(launcher.wait())
                raise AssertionError("a launcher did not finish within %d s" % ROUND_TIMEOUT_S)
        return codes

    def run(self):
        os.makedirs(self.harness, exist_ok=True)
        with open(os.path.join(self.harness, "train.py"), "w") as f:
            f.write(TRAINING)
        launchers = self.start()
        victim = self.kill_something(launchers)
        log("round seed %d: %d saves on %d node(s), killed the %s" % (self.seed, self.saves, self.nodes, victim))
        # A killed launcher is started again on the same volume (with another node, both are:
        # the other would only stop on its lost peer); half the time it is killed again.
        while victim.startswith("launcher"):
            for launcher in launchers:
                launcher.kill()
            self.wait(launchers)
            launchers = self.start()
            if self.rng.random() >= 0.5:
                break
            victim = self.kill_something(launchers)
            log("  started again, killed the %s" % victim)
        codes = self.wait(launchers)
        if any(code != 0 for code in codes):
            raise AssertionError("the last run exited %s (logs in %s)" % (codes, self.harness))


def ledger(work, rank):
    saves, rotated = {}, set()
    path = os.path.join(work, "harness", "ledger-%d.jsonl" % rank)
    for line in open(path) if os.path.exists(path) else []:
        entry = json.loads(line)
        if "rotated" in entry:
            rotated.add(bytes.fromhex(entry["rotated"]))
        else:
            name = bytes.fromhex(entry["name"])
            saves.setdefault(name, []).append(entry["save"])
            rotated.discard(name)
    return saves, rotated


def commit_record(destination, name):
    if name not in XXH3_NAMES:
        return None
    text = destination.read("%s/.bt-commits/%s.json" % (JOB, XXH3_NAMES[name]))
    return json.loads(text) if text else None


XXH3_NAMES = {}  # name → the XXH3-128 its commit record is stored under (learn_record_names)


def check_invariants(work, destination, nodes, saved_before_last_start=-1):
    environment = launcher_environment(work, destination)
    config = os.path.join(work, "harness", "job.json")
    listing = subprocess.run([BIN, "checkpoints", "--config", config, "--root", os.path.join(work, "root"), "--verify",
                              "--format", "json"], env=environment, capture_output=True, timeout=300)
    assert listing.returncode == 0, "checkpoints --verify exited %d: %s %s" % (listing.returncode, listing.stdout[-2000:],
                                                                              listing.stderr[-2000:])
    rows = json.loads(listing.stdout)["checkpoints"]
    assert all(row["verified"] for row in rows), "a committed version differs from its manifest: %s" % rows
    ledgers = [ledger(work, rank) for rank in range(nodes)]
    committed = {}
    for name, saves in ledgers[0][0].items():
        ids = []
        for rank in range(nodes):
            text = read_committed_id(destination, name, rank)
            ids.append(text)
        if ids[0] is None:
            if nodes > 1 and max(saves) <= saved_before_last_start:
                continue  # a save of the run before the launchers started again: never committed by them
            assert name in ledgers[0][1], "%r was completed (saves %s) and never rotated, but is not committed" % (name, saves)
            continue
        assert all(text is not None for text in ids), "%r: a node's committed part is not a whole save: %s" % (name, ids)
        numbers = {int(text.split()[0]) for text in ids}
        assert len(numbers) == 1, "%r: the nodes' committed parts are different saves: %s" % (name, ids)
        number = numbers.pop()
        assert number in saves, "%r: committed save %d was never completed (completed: %s)" % (name, number, saves)
        # The newest save of the name the launchers could commit: with other nodes, not one
        # of the run before they started again (see above).
        newest = [save for save in saves if nodes == 1 or save > saved_before_last_start or save == number]
        if name not in ledgers[0][1]:
            assert number == newest[-1], "%r: committed save %d, but save %d was complete" % (name, number, newest[-1])
        committed[name] = number
    latest = destination.read(JOB + "/latest")
    if committed:
        assert latest is not None, "checkpoints are committed but there is no latest"
        assert latest.rstrip(b"\n") in committed, "latest names %r, which is not committed" % latest
    return committed


def read_committed_id(destination, name, rank):
    record = commit_record(destination, name)
    if record is None:
        return None
    version = record["parts"].get(str(rank))
    if version is None:
        return None
    text = destination.read("%s/rank-%d/.bt-versions/%s/%s/id" % (JOB, rank, version, os.fsdecode(name)))
    return text.decode() if text else None


def learn_record_names(work, destination):
    """The XXH3-128 of each name, from the commit records themselves."""
    if MODE == "file":
        directory = os.path.join(work, "remote", JOB, ".bt-commits")
        paths = os.listdir(directory) if os.path.isdir(directory) else []
        texts = {path: open(os.path.join(directory, path), "rb").read() for path in paths}
    else:
        result = subprocess.run(["rclone", "lsf", "h:%s/runs/%s/.bt-commits" % (BUCKET, JOB)],
                                env=destination.rclone_env, capture_output=True, timeout=60)
        paths = result.stdout.decode().split()
        texts = {path: destination.read("%s/.bt-commits/%s" % (JOB, path)) for path in paths}
    for path, text in texts.items():
        if not path.endswith(".json") or text is None:
            continue
        name = json.loads(text)["name"]
        name = bytes.fromhex(name["bytes_hex"]) if isinstance(name, dict) else name.encode()
        XXH3_NAMES[name] = path[:-len(".json")]


# What bt-launch itself creates in $TMPDIR (storage/destination.cpp, the verifying listing).
TEMPORARY_PREFIXES = ("bt-launch-get.", "bt-launch-files.", "bt-launch-put.", "bt-launch-verify.")


def launcher_environment(work, destination):
    """Everything the harness starts gets a TMPDIR of this run's own: the other tests that
    ctest runs beside it make and remove bt-launch temporaries in /tmp, which a check of
    /tmp would count as this run's litter."""
    environment = dict(os.environ, **destination.env)
    environment.pop("AWS_CA_BUNDLE", None)
    environment["TMPDIR"] = os.path.join(work, "tmp")
    os.makedirs(environment["TMPDIR"], exist_ok=True)
    return environment


def bt_temporaries(work):
    return {entry for entry in os.listdir(os.path.join(work, "tmp")) if entry.startswith(TEMPORARY_PREFIXES)}


def stray_files(work):
    """What is in the work directory besides the destination, the job's root, the harness
    and the temporaries' directory."""
    allowed = {"root", "remote", "harness", "tmp"}
    return sorted(set(os.listdir(work)) - allowed)


def main():
    if MODE == "s3" and (shutil.which("rclone") is None or shutil.which("moto_server") is None):
        print("SKIPPED: rclone or moto_server is not installed")
        return 77
    seed = int(os.environ.get("SEED", random.randrange(1, 1 << 30)))
    rounds = int(os.environ.get("ROUNDS", 40 if os.environ.get("CRASH_SOAK") else 2))
    log("mode %s, seed %d (SEED=%d replays it), %d round(s) per node count" % (MODE, seed, seed, rounds))
    for nodes in (1, 2):
        work = tempfile.mkdtemp(prefix="bt-crash-")
        destination = Destination(work)
        os.makedirs(os.path.join(work, "tmp"))
        try:
            for number in range(rounds):
                round_ = Round(work, destination, nodes, seed + nodes * 1000, number)
                round_.run()
                learn_record_names(work, destination)
                committed = check_invariants(work, destination, nodes, round_.saved_before_last_start)
                log("  invariants hold: %d checkpoint(s) committed" % len(committed))
                assert not stray_files(work), "written outside the destination and the job: %s" % stray_files(work)
                left = bt_temporaries(work)
                assert not left, "bt-launch left temporaries in TMPDIR: %s" % sorted(left)
        except AssertionError as failure:
            log("FAIL (seed %d, work directory %s kept): %s" % (seed, work, failure))
            destination.close()
            return 1
        destination.close()
        shutil.rmtree(work, ignore_errors=True)
    log("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
