#!/usr/bin/env python3
"""The nemesis soak: restart in place and the commit rule under random compound faults.

Each seed runs one job of three nodes, each a bt-launch process on a host of its own (a
network namespace on a bridge, as tests/integration/netns_test.sh makes them), with
checkpointing to a shared file:// destination, each node's checkpoint directory on a small
tmpfs of its own, and restarts on. The training (TRAINING below) saves a folder per step,
`step-NNNNNN/`, every ~0.5 s, each node's shard saying the step, the cycle and the attempt
that wrote it, and resumes from what bt-launch loads into BT_LOAD_CHECKPOINT_DIR. While it
runs a nemesis injects faults at random times (FAULTS below): SIGKILL of a trainer, of a
launcher (a replacement then starts in its slot, as Kubernetes does), of an uploader;
SIGSTOP of a launcher for longer than the heartbeat timeout; a node's link cut then healed;
the node's checkpoint disk filled then freed; SIGTERM to every launcher; every launcher
SIGKILLed and started again on the same volumes (a platform retry). A job that ends before
its last step is retried, as the platform does, on the same volumes and destination; the
last attempt runs without faults.

After every attempt, and while it runs (a sampler reads the destination every 0.1 s), it
checks ../shared/DESIGN.md §3's commit rule and:

  latest-verified     `bt-launch checkpoints --verify` passes; `latest` names a commit record
                      whose every part is present, and the record names every rank that saved
  one-save            every commit record's parts say the same step, cycle and attempt (one
                      save), the step its name says
  latest-monotonic    `latest` never names an older step than it did before
  versions-immutable  no committed version changes or vanishes (hashed when first seen)
  resume-newest       every cycle starts, on every node, from the same save, at least the
                      newest commit seen before node 0 decided the restart, and a committed one
  no-survivors        nothing is left in a host's namespace once its launcher has exited
  exit-codes          every node's last launcher exits with the same code
  restart-budget      cycles are numbered 0, 1, ... the same on every node, never past
                      max_restarts, and node 0 logs one decision per cycle
  recovers            an attempt whose faults a restart in place can absorb (everything but
                      node 0 lost, a SIGTERM or a whole-job kill) ends 0 with every step done,
                      and its last save committed
  no-secret           the secret in the job's environment appears in no log line and no
                      process's command line

About two seeds in five (SOAK_SPARES=1 forces it, 0 turns it off; it needs the fake NVML the
build makes, tests/health/fake_nvml.c) run with a hot spare (launcher.spares 1, a fourth
launcher on a host of its own) and one more fault, gpu-lost: Xid 79 on a node's GPU. The
node's rank, node 0's too, moves to the spare; a node that left (75) is replaced in its
slot by a launcher on a healthy host, which joins as a spare. Node 0 whose rank moved keeps
serving the store to the end; node 0 that cannot train with no spare ready ends the job
(75 on node 0, 69 on the others: a fault a restart does not absorb). A 75 is the code of the
node that left, not the job's: exit-codes compares the others.

Usage: nemesis_soak.py BT_LAUNCH [--seeds N | --seed S] [--first-seed S] [--keep]
  SOAK=N        runs N seeds (the default: 3, a few minutes on two cores)
  SOAK_SUBNET   the bridge's /24 (10.78.0): soaks run side by side each need their own
  --seed S      replays seed S exactly as the failing run printed it
Exit 0 all invariants held, 1 a violation (each printed with its replay command), 77 SKIPPED
(not root, or no network namespaces here).
"""
import argparse
import hashlib
import json
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HEARTBEAT_INTERVAL_S = 0.5
HEARTBEAT_TIMEOUT_S = 3
REJOIN_TIMEOUT_S = 30
DRAIN_TIMEOUT_S = 45
MAX_RESTARTS = 6
ATTEMPTS = 3                  # the platform's retries: the last runs without faults
ATTEMPT_DEADLINE_S = 150      # an attempt still running after this is a hang
STEPS = 30                    # training steps per job
STEP_PERIOD_S = 0.5
TMPFS_BYTES = 12 << 20        # each node's checkpoint disk
SHARD_PAYLOAD_BYTES = 96 << 10
SUBNET = os.environ.get("SOAK_SUBNET", "10.78.0")  # another /24 per soak run at the same time
NODES = 3
LOG_PREFIX = "[nemesis soak]"

# The training every node runs. A save is collective (a barrier through the shared harness
# folder, as NCCL's would be): every saving rank writes its shard and payload, then its own
# marker. It logs what it loaded and every save, one JSON line each, to its node's ledger.
TRAINING = r'''
import hashlib, json, os, random, shutil, sys, time
ledger_dir, steps, period, savers, secret_digest = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5]
rank = int(os.environ["BT_NODE_RANK"])
nodes = int(os.environ["BT_GROUP_SIZE"])
cycle = int(os.environ.get("BT_RESTART_COUNT", "0"))
attempt = int(os.environ["SOAK_ATTEMPT"])
ckpt = os.environ["BT_CHECKPOINT_DIR"]
load = os.environ.get("BT_LOAD_CHECKPOINT_DIR", "")
resume = os.environ.get("BT_RESUME_CHECKPOINT", "")
saving = savers == "all" or rank == 0
def note(**entry):
    entry.update(rank=rank, cycle=cycle, attempt=attempt, pid=os.getpid(), t=time.time())
    with open(os.path.join(ledger_dir, "ledger-%d.jsonl" % rank), "a") as f:
        f.write(json.dumps(entry) + "\n")
part = os.path.join(load, "rank-%d" % rank) if load else ""
entries = sorted(os.listdir(part)) if part and os.path.isdir(part) else []
loaded = None
if resume:
    shard = os.path.join(part, resume, "shard.json")
    if os.path.exists(shard):
        loaded = json.load(open(shard))
secret_seen = hashlib.sha256(os.environ.get("SOAK_SECRET", "").encode()).hexdigest() == secret_digest
note(event="start", resume=resume, loaded=loaded, entries=entries, secret_seen=secret_seen,
     load_dir=load, in_checkpoint_dir=bool(load) and os.path.realpath(load).startswith(os.path.realpath(ckpt) + "/"))
first = int(resume.split("-")[1]) + 1 if resume.startswith("step-") else 1
def barrier(step, phase, ok=True):
    """Every rank's `ok` for this step and phase, once all have arrived (NCCL's all-reduce)."""
    mine = os.path.join(ledger_dir, "barrier", "%d-%d-%d-%s-%d" % (attempt, cycle, step, phase, rank))
    with open(mine + ".tmp", "w") as f:
        f.write("ok" if ok else "failed")
    os.rename(mine + ".tmp", mine)
    others = [mine[:mine.rindex("-")] + "-%d" % r for r in range(nodes)]
    deadline = time.time() + 90
    while not all(os.path.exists(p) for p in others):
        if time.time() > deadline:
            note(event="barrier-timeout", step=step)
            sys.exit(3)
        time.sleep(0.02)
    return all(open(p).read() == "ok" for p in others)
def write_part(folder, step):
    """This rank's files of the save, without its marker; False when the disk is full."""
    try:
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
        with open(os.path.join(folder, "shard.json"), "w") as f:
            json.dump({"step": step, "cycle": cycle, "attempt": attempt, "rank": rank, "pid": os.getpid()}, f)
        with open(os.path.join(folder, "payload.bin"), "wb") as f:
            f.write(os.urandom(PAYLOAD_BYTES))
        return True
    except OSError as error:
        note(event="save-failed", step=step, error=str(error))
        return False
# A save is collective, as torch.distributed.checkpoint's: every saving rank writes its
# files, all agree that every rank succeeded, then each writes its marker. A save that
# failed anywhere (a full disk) is removed everywhere and never complete.
for step in range(first, steps + 1):
    time.sleep(period * random.uniform(0.7, 1.3))
    barrier(step, "step")
    name = "step-%06d" % step
    folder = os.path.join(ckpt, name)
    written = write_part(folder, step) if saving else True
    if not barrier(step, "written", written):
        shutil.rmtree(folder, ignore_errors=True)
        note(event="save-abandoned", step=step)
        continue
    if not saving:
        note(event="step", step=step)
        continue
    try:
        open(os.path.join(folder, ".complete"), "w").close()
    except OSError as error:
        shutil.rmtree(folder, ignore_errors=True)
        note(event="save-failed", step=step, error=str(error), marker=True)
        continue
    note(event="save", step=step, name=name)
    shutil.rmtree(os.path.join(ckpt, "step-%06d" % (step - 3)), ignore_errors=True)
note(event="done", step=steps)
'''.replace("PAYLOAD_BYTES", str(SHARD_PAYLOAD_BYTES))

# Fault kinds and their weights. `recoverable` faults are those a restart in place absorbs:
# the job must still end 0 with every step done.
FAULTS = {
    "kill-trainer": (3, True),
    "kill-follower-launcher": (3, True),   # a replacement starts in its slot
    "kill-leader-launcher": (1, False),    # node 0 lost ends the job (69): the platform retries
    "kill-uploader": (2, True),
    "kill-rclone": (2, True),              # s3 only: SIGKILL of an uploader's rclone
    "stop-follower-launcher": (2, True),   # SIGSTOP longer than the heartbeat timeout
    "stop-leader-launcher": (1, False),
    "partition-follower": (2, True),       # its link down, then up
    "partition-leader": (1, False),
    "fill-disk": (2, True),                # the node's checkpoint tmpfs full, then freed
    "sigterm-all": (1, False),
    "kill-all": (1, False),                # every launcher SIGKILLed, started again (a platform retry)
    "gpu-lost": (2, True),                 # with a spare only: Xid 79 on a node's GPU; its rank moves
}


def log(*parts):
    print(LOG_PREFIX, *parts, flush=True)


def sh(*argv, check=True):
    result = subprocess.run(argv, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise RuntimeError("%s failed: %s" % (" ".join(argv), result.stderr.strip()))
    return result


class Violation(Exception):
    pass


class Hosts:
    """Four hosts on a bridge (the fourth for a seed with a spare), each a network namespace
    with its own checkpoint tmpfs."""

    def __init__(self, work):
        self.tag = "bs%d" % os.getpid()  # at most 7 digits: interface names stay under 16 bytes
        self.bridge = self.tag + "br"
        self.bridge_address = SUBNET + ".1"
        self.work = work
        self.mounts = []
        self.namespaces = []

    def namespace(self, node):
        return "%sn%d" % (self.tag, node)

    def veth(self, node):
        return "%sv%d" % (self.tag, node)

    def address(self, node):
        return "%s.1%d" % (SUBNET, node)

    def create(self):
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        sh("ip", "link", "set", self.bridge, "up")
        sh("ip", "addr", "add", self.bridge_address + "/24", "dev", self.bridge)  # the object store's host
        for node in range(NODES + 1):
            ns = self.namespace(node)
            sh("ip", "netns", "add", ns)
            self.namespaces.append(ns)
            sh("ip", "link", "add", self.veth(node), "type", "veth", "peer", "name", "eth0", "netns", ns)
            sh("ip", "link", "set", self.veth(node), "master", self.bridge, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
            sh("ip", "-n", ns, "addr", "add", self.address(node) + "/24", "dev", "eth0")
            os.makedirs("/etc/netns/" + ns, exist_ok=True)
            with open("/etc/netns/%s/hosts" % ns, "w") as f:
                f.write("127.0.0.1 localhost\n")

    def mount_disk(self, path):
        os.makedirs(path, exist_ok=True)
        sh("mount", "-t", "tmpfs", "-o", "size=%d" % TMPFS_BYTES, "tmpfs", path)
        self.mounts.append(path)

    def pids(self, node):
        result = sh("ip", "netns", "pids", self.namespace(node), check=False)
        return [int(p) for p in result.stdout.split()]

    def link(self, node, up):
        sh("ip", "link", "set", self.veth(node), "up" if up else "down", check=False)

    def destroy(self):
        # A second SIGINT or SIGTERM (ctest's, a user's) must not cut the clean-up short.
        previous = {number: signal.signal(number, signal.SIG_IGN) for number in (signal.SIGINT, signal.SIGTERM)}
        try:
            self.remove_everything()
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)

    def remove_everything(self):
        for ns in self.namespaces:
            for pid in sh("ip", "netns", "pids", ns, check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGCONT)
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
        time.sleep(0.2)
        for path in reversed(self.mounts):
            sh("umount", "-l", path, check=False)
        for ns in self.namespaces:
            sh("ip", "netns", "del", ns, check=False)
            shutil.rmtree("/etc/netns/" + ns, ignore_errors=True)
        sh("ip", "link", "del", self.bridge, check=False)
        try:
            os.rmdir("/etc/netns")
        except OSError:
            pass


def sweep_leftovers():
    """Removes what an earlier soak killed before its clean-up (SIGKILL, a machine's timeout)
    left: its namespaces, bridge and hosts files (tagged bs<pid>) and its tmpfs mounts (its
    work folder's .running names its pid), where that process no longer runs."""
    for line in sh("ip", "netns", "list", check=False).stdout.splitlines():
        match = re.match(r"(bs(\d+))n\d\b", line)
        if not match or os.path.exists("/proc/%s" % match.group(2)):
            continue
        hosts = Hosts("/nonexistent")
        hosts.tag, hosts.bridge = match.group(1), match.group(1) + "br"
        hosts.namespaces = [match.group(0)]
        hosts.remove_everything()
    with open("/proc/self/mounts") as mounts:
        for line in mounts:
            target = line.split()[1]
            owner = re.match(r"/tmp/bt-soak-\d+\.[^/]+/", target)
            if not line.startswith("tmpfs ") or not owner:
                continue
            try:
                running = open(os.path.join(owner.group(0), ".running")).read().strip()
            except OSError:
                running = ""
            if not running or not os.path.exists("/proc/" + running):
                sh("umount", "-l", target, check=False)


def processes():
    """{pid: (command line bytes, parent pid)} of every process now."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % entry, "rb") as f:
                line = f.read()
            with open("/proc/%s/stat" % entry) as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        found[int(entry)] = (line, parent)
    return found


def descendants(pid, table):
    children = [p for p, (_, parent) in table.items() if parent == pid]
    return children + [d for child in children for d in descendants(child, table)]


def hash_tree(path):
    digest = hashlib.sha256()
    if not os.path.isdir(path):
        return None
    for directory, folders, files in sorted(os.walk(path)):
        folders.sort()
        for name in sorted(files):
            full = os.path.join(directory, name)
            digest.update(os.path.relpath(full, path).encode() + b"\0")
            with open(full, "rb") as f:
                digest.update(hashlib.sha256(f.read()).digest())
    return digest.hexdigest()


def step_of(name):
    match = re.fullmatch(r"step-(\d+)", name or "")
    return int(match.group(1)) if match else None


class Destination:
    """The shared file:// destination, read back as the sampler sees it."""

    def __init__(self, root, job_id, object_store=None):
        self.root = root
        self.job = os.path.join(root, job_id)
        self.object_store = object_store  # an s3 destination is read through a local mirror
        self.mirrored = 0.0
        self.latest_history = []        # (time, name)
        self.records = {}               # record text digest -> (time first seen, record)
        self.versions = {}              # (rank, version) -> digest when first seen
        self.violations = []
        self.lock = threading.Lock()

    def read(self, relative):
        try:
            with open(os.path.join(self.job, relative), "rb") as f:
                return f.read()
        except OSError:
            return None

    def sample(self):
        if self.object_store and time.time() - self.mirrored >= 1.0:
            self.object_store.mirror(os.path.basename(self.job), self.job)
            self.mirrored = time.time()
        latest = self.read("latest")
        now = time.time()
        if latest is not None:
            name = latest.decode(errors="replace").strip()
            with self.lock:
                if not self.latest_history or self.latest_history[-1][1] != name:
                    previous = self.latest_history[-1][1] if self.latest_history else None
                    self.latest_history.append((now, name))
                    if previous is not None and (step_of(name) or 0) < (step_of(previous) or 0):
                        self.violations.append(("latest-monotonic", "latest moved back from %s to %s" % (previous, name)))
        commits = os.path.join(self.job, ".bt-commits")
        for entry in sorted(os.listdir(commits)) if os.path.isdir(commits) else []:
            text = self.read(".bt-commits/" + entry)
            if not text or not entry.endswith(".json"):
                continue
            key = hashlib.sha256(text).hexdigest()
            if key in self.records:
                continue
            try:
                record = json.loads(text)
            except ValueError:
                continue  # written atomically: a torn record would itself be a finding below
            parts = {}
            for rank, version in record.get("parts", {}).items():
                folder = os.path.join(self.job, "rank-%s" % rank, ".bt-versions", version)
                digest = hash_tree(folder)
                with self.lock:
                    self.versions.setdefault((rank, version), digest)
                shard = os.path.join(folder, record.get("name", "") if isinstance(record.get("name"), str) else "",
                                     "shard.json")
                try:
                    parts[rank] = json.load(open(shard))
                except (OSError, ValueError):
                    parts[rank] = None
            with self.lock:
                self.records[key] = (now, record, parts)

    def commits_by_name(self):
        with self.lock:
            newest = {}
            for seen, record, parts in self.records.values():
                name = record.get("name")
                if name not in newest or newest[name][0] < seen:
                    newest[name] = (seen, record, parts)
            return newest

    def latest_before(self, moment):
        with self.lock:
            names = [name for seen, name in self.latest_history if seen < moment]
        return names[-1] if names else None


class ObjectStore:
    """moto_server on the bridge (every host reaches it; a host cut off loses it too), read
    back with rclone into a local mirror that the checks read as they read a file:// one."""

    def __init__(self, work, address):
        self.port = random.randrange(20000, 32000)
        self.address = address
        self.endpoint = "http://%s:%d" % (address, self.port)
        self.log = open(os.path.join(work, "moto.log"), "wb")
        self.server = subprocess.Popen(["moto_server", "-H", address, "-p", str(self.port)], stdout=self.log,
                                       stderr=self.log)
        self.rclone_env = {"PATH": os.environ["PATH"], "HOME": work, "RCLONE_CONFIG_H_TYPE": "s3",
                           "RCLONE_CONFIG_H_PROVIDER": "Other", "RCLONE_CONFIG_H_ACCESS_KEY_ID": "testing",
                           "RCLONE_CONFIG_H_SECRET_ACCESS_KEY": "testing", "RCLONE_CONFIG_H_ENDPOINT": self.endpoint,
                           "RCLONE_CONFIG_H_REGION": "us-east-1"}
        self.launcher_env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                             "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": self.endpoint}
        for _ in range(100):
            if subprocess.run(["rclone", "mkdir", "h:soak"], env=self.rclone_env, capture_output=True,
                              timeout=30).returncode == 0:
                return
            time.sleep(0.2)
        raise RuntimeError("moto_server did not start on %s" % self.endpoint)

    uri = "s3://soak/runs"

    def mirror(self, job_id, folder):
        subprocess.run(["rclone", "sync", "h:soak/runs/" + job_id, folder], env=self.rclone_env, capture_output=True,
                       timeout=60)

    def close(self):
        self.server.kill()
        self.server.wait()
        self.log.close()


class Node:
    """One slot's launchers: the first, and every replacement started in its slot."""

    def __init__(self, rank):
        self.rank = rank
        self.launchers = []  # [(Popen, log path, killed by the nemesis)]

    def current(self):
        return self.launchers[-1][0] if self.launchers else None


class Soak:
    def __init__(self, binary, seed, work, hosts, args):
        self.binary = binary
        self.seed = seed
        self.rng = random.Random(seed)
        self.work = work
        self.hosts = hosts
        self.args = args
        self.job_id = "soak-%d" % seed
        self.remote = os.path.join(work, "remote")
        self.object_store = ObjectStore(work, hosts.bridge_address) if args.destination == "s3" else None
        self.destination_uri = self.object_store.uri if self.object_store else "file://" + self.remote
        self.destination = Destination(self.remote, self.job_id, self.object_store)
        self.ledgers = os.path.join(work, "ledgers")
        self.logs = os.path.join(work, "logs")
        self.secret = "soak-secret-%032x" % random.Random(seed ^ 0x5EC).getrandbits(128)
        self.savers = "rank0" if self.rng.random() < 0.25 else "all"  # DDP: only rank 0 saves
        # Its own draw, so that a seed without a spare replays as it did before spares.
        self.fake_nvml = os.path.join(os.path.dirname(os.path.dirname(binary)), "tests", "fake_nvml",
                                      "libnvidia-ml.so.1")
        forced = os.environ.get("SOAK_SPARES")
        wanted = int(forced) if forced in ("0", "1") else int(random.Random(seed ^ 0x5BA4E).random() < 0.4)
        self.spares = wanted if os.path.exists(self.fake_nvml) else 0
        self.slots = NODES + self.spares
        self.gpu_lost = set()  # (attempt, slot) whose GPU the nemesis failed
        self.faults = {}
        self.violations = []
        self.decisions = []   # (time seen, attempt, line) from node 0's log
        self.cycles_started = set()  # (attempt, cycle) whose barrier passed, from node 0's log
        self.stop_sampler = threading.Event()
        self.cmdline_leaks = set()

    # --- set-up -----------------------------------------------------------------------
    def prepare(self):
        for folder in (self.ledgers, os.path.join(self.ledgers, "barrier"), self.logs, self.remote,
                       os.path.join(self.work, "secrets"), os.path.join(self.work, "tmp")):
            os.makedirs(folder, exist_ok=True)
        with open(os.path.join(self.work, "secrets", "soak-secret"), "w") as f:
            f.write(self.secret + "\n")
        with open(os.path.join(self.work, "train.py"), "w") as f:
            f.write(TRAINING)
        for node in range(self.slots):
            self.hosts.mount_disk(self.checkpoint_dir(node))
            self.write_gpu(node, healthy=True)
        digest = hashlib.sha256(self.secret.encode()).hexdigest()
        command = "exec python3 %s %s %d %s %s %s" % (os.path.join(self.work, "train.py"), self.ledgers, STEPS,
                                                      STEP_PERIOD_S, self.savers, digest)
        config = {
            "compute": {"node_count": NODES}, "enable_baseten_workdir": False,
            "runtime": {"start_commands": [command], "checkpointing_config": {"enabled": True},
                        "environment_variables": {"SOAK_SECRET": {"name": "soak-secret"}}},
            "launcher": {"job_id": self.job_id, "grace_period_s": 2, "peer_failure_grace_s": 2,
                         "restart": {"max_restarts": MAX_RESTARTS, "rejoin_timeout_s": REJOIN_TIMEOUT_S,
                                     "max_cycles_without_progress": MAX_RESTARTS + 1},
                         "rendezvous": {"join_timeout_s": 30, "heartbeat_interval_s": HEARTBEAT_INTERVAL_S,
                                        "heartbeat_timeout_s": HEARTBEAT_TIMEOUT_S},
                         "checkpoint": {"destination": self.destination_uri, "drain_timeout_s": DRAIN_TIMEOUT_S,
                                        "scan_interval_s": 0.5, "quiet_period_s": 600}}}
        if self.spares:
            config["launcher"]["spares"] = self.spares
            config["launcher"]["health"] = {"interval_s": 1}
        self.config = os.path.join(self.work, "job.json")
        with open(self.config, "w") as f:
            json.dump(config, f, indent=1)

    def write_gpu(self, slot, healthy):
        """The fake NVML's state of the slot's host (read at every call): one GPU, healthy or
        fallen off the bus (Xid 79). Written whole, renamed over the old one."""
        path = os.path.join(self.work, "nvml-%d" % slot)
        with open(path + ".tmp", "w") as f:
            f.write("gpus 1\ngpu 0 uuid GPU-soak-%d\n%s" % (slot, "" if healthy else "xid 1 0 79\n"))
        os.rename(path + ".tmp", path)

    def root(self, node):
        return os.path.join(self.work, "root-%d" % node)

    def checkpoint_dir(self, node):
        return os.path.join(self.root(node), "node-%d" % node, "mnt", "ckpts")

    def start_launcher(self, node, attempt):
        log_path = os.path.join(self.logs, "attempt%d-node%d-%d.log" % (attempt, node.rank, len(node.launchers)))
        environment = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"),
                       "TMPDIR": os.path.join(self.work, "tmp"), "BT_LEADER_ADDR": self.hosts.address(0),
                       "BT_NODE_RANK": str(node.rank), "BT_GROUP_SIZE": str(self.slots),
                       "BT_RENDEZVOUS_TOKEN": "soak-token", "BT_SECRETS_DIR": os.path.join(self.work, "secrets"),
                       "SOAK_ATTEMPT": str(attempt), "SOAK_TAG": self.hosts.tag}
        if self.object_store:
            environment.update(self.object_store.launcher_env)
        if self.spares:
            environment.update({"BT_NVML_LIBRARY": self.fake_nvml,
                                "BT_FAKE_NVML_STATE": os.path.join(self.work, "nvml-%d" % node.rank)})
        argv = ["ip", "netns", "exec", self.hosts.namespace(node.rank), "unshare", "--uts", "sh", "-c",
                "hostname host%d; exec %s run --config %s --root %s" % (node.rank, shlex.quote(self.binary),
                                                                       shlex.quote(self.config),
                                                                       shlex.quote(self.root(node.rank)))]
        out = open(log_path, "ab")
        process = subprocess.Popen(argv, env=environment, stdout=out, stderr=out, start_new_session=True)
        out.close()
        process.started_at = time.time()
        node.launchers.append([process, log_path, False])
        return process

    # --- the sampler --------------------------------------------------------------------
    def sampler(self, attempt_holder):
        seen_lines, ticks = {}, 0
        while not self.stop_sampler.is_set():
            try:
                self.destination.sample()
            except OSError:
                pass
            ticks += 1
            for line, _ in (processes().values() if ticks % 5 == 0 else []):
                if self.secret.encode() in line:
                    self.cmdline_leaks.add(line.replace(b"\0", b" ").decode(errors="replace")[:300])
            for path in sorted(os.listdir(self.logs)):
                if "-node0-" not in path:
                    continue
                full = os.path.join(self.logs, path)
                offset = seen_lines.get(full, 0)
                with open(full, "rb") as f:
                    f.seek(offset)
                    data = f.read()
                complete = data[:data.rfind(b"\n") + 1]
                seen_lines[full] = offset + len(complete)
                for line in complete.decode(errors="replace").splitlines():
                    if re.search(r"restart \d+/\d+: cycle \d+ failed", line):
                        self.decisions.append((time.time(), attempt_holder[0], line))
                    started = re.search(r"every node is ready: running cycle (\d+)", line)
                    if started:
                        self.cycles_started.add((attempt_holder[0], int(started.group(1))))
            time.sleep(0.1)

    # --- the nemesis --------------------------------------------------------------------
    def schedule(self, faulty):
        """The attempt's faults, drawn from the seed before anything runs, so that a seed
        replays the same kinds, targets, times and durations: [fault dict]."""
        kinds = sorted(k for k in FAULTS if (k != "kill-rclone" or self.object_store) and (k != "gpu-lost" or self.spares))
        weights = [FAULTS[k][0] for k in kinds]
        faults, at = [], self.rng.uniform(2, 8)
        for _ in range(self.rng.randrange(1, 4) if faulty else 0):
            faults.append({"at": at, "kind": self.rng.choices(kinds, weights)[0], "any": self.rng.randrange(NODES),
                           "follower": self.rng.randrange(1, NODES), "pause": self.rng.uniform(1, 4),
                           "delay": self.rng.uniform(0.5, 3.0)})
            at += self.rng.uniform(0.5, 6)
        return faults

    def trainers(self, rank):
        table = processes()
        return [pid for pid in self.hosts.pids(rank)
                if pid in table and b"train.py" in table[pid][0] and b"python3" in table[pid][0]]

    def uploaders(self, rank, nodes):
        launcher = nodes[rank].current()
        table = processes()
        return [pid for pid in descendants(launcher.pid, table) if b"upload-worker" in table[pid][0]]

    def signal_pids(self, pids, number):
        for pid in pids:
            try:
                os.kill(pid, number)
            except ProcessLookupError:
                pass

    def inject(self, fault, nodes, attempt):
        """Does one fault; returns what it did (for the log), or None where nothing was there to hit."""
        kind, follower = fault["kind"], fault["follower"]
        if kind == "kill-trainer":
            rank = fault["any"]
            pids = self.trainers(rank)
            if not pids:
                return None
            self.signal_pids(pids, signal.SIGKILL)
            return "SIGKILL trainer of node %d" % rank
        if kind in ("kill-follower-launcher", "kill-leader-launcher"):
            rank = follower if kind == "kill-follower-launcher" else 0
            node = nodes[rank]
            process = node.current()
            if process.poll() is not None:
                return None
            node.launchers[-1][2] = True
            process.kill()
            process.wait()
            if rank != 0:
                time.sleep(fault["delay"])  # the orchestrator notices, schedules a new pod
                self.start_launcher(node, attempt)
                return "SIGKILL launcher of node %d, a replacement started in its slot" % rank
            return "SIGKILL launcher of node 0"
        if kind == "kill-uploader":
            rank = fault["any"]
            pids = self.uploaders(rank, nodes)
            if not pids:
                return None
            self.signal_pids(pids, signal.SIGKILL)
            return "SIGKILL uploader of node %d" % rank
        if kind == "kill-rclone":
            rank = fault["any"]
            table = processes()
            pids = [pid for pid in descendants(nodes[rank].current().pid, table)
                    if table[pid][0].split(b"\0")[0].endswith(b"rclone")]
            if not pids:
                return None
            self.signal_pids(pids, signal.SIGKILL)
            return "SIGKILL rclone of node %d" % rank
        if kind in ("stop-follower-launcher", "stop-leader-launcher"):
            rank = follower if kind == "stop-follower-launcher" else 0
            process = nodes[rank].current()
            if process.poll() is not None:
                return None
            pause = HEARTBEAT_TIMEOUT_S + fault["pause"]
            process.send_signal(signal.SIGSTOP)
            time.sleep(pause)
            process.send_signal(signal.SIGCONT)
            return "SIGSTOP launcher of node %d for %.1f s" % (rank, pause)
        if kind in ("partition-follower", "partition-leader"):
            rank = follower if kind == "partition-follower" else 0
            pause = HEARTBEAT_TIMEOUT_S + fault["pause"]
            self.hosts.link(rank, False)
            time.sleep(pause)
            self.hosts.link(rank, True)
            return "node %d's link down for %.1f s" % (rank, pause)
        if kind == "fill-disk":
            rank = fault["any"]
            filler = os.path.join(self.checkpoint_dir(rank), ".soak-filler")
            usage = shutil.disk_usage(self.checkpoint_dir(rank))
            if usage.free < (1 << 20):  # the checkpoints themselves filled it: a finding, not a fault
                self.violation("disk-leak", attempt, "node %d's checkpoint disk holds %d of %d bytes before the "
                               "nemesis fills it: %s" % (rank, usage.used, usage.total,
                                                         sh("du", "-a", "--max-depth=3", self.checkpoint_dir(rank),
                                                            check=False).stdout[-1500:]))
                return None
            try:
                descriptor = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            except OSError as error:
                self.violation("disk-leak", attempt, "node %d's checkpoint disk takes no new file (%s) before the "
                               "nemesis fills it: %s" % (rank, error, sh("du", "-a", "--max-depth=3",
                                                                          self.checkpoint_dir(rank),
                                                                          check=False).stdout[-1500:]))
                return None
            try:
                for block in (1 << 20, 4096, 1):  # down to the last byte
                    try:
                        while True:
                            os.write(descriptor, b"\0" * block)
                    except OSError:
                        pass
            finally:
                os.close(descriptor)
            pause = fault["pause"]
            time.sleep(pause)
            os.unlink(filler)
            return "node %d's checkpoint disk full for %.1f s" % (rank, pause)
        if kind == "gpu-lost":
            slot = fault["any"]
            if nodes[slot].current().poll() is not None or (attempt, slot) in self.gpu_lost:
                return None
            self.gpu_lost.add((attempt, slot))
            self.write_gpu(slot, healthy=False)
            return "Xid 79 on node %d's GPU" % slot
        if kind == "sigterm-all":
            for node in nodes:
                if node.current().poll() is None:
                    node.current().send_signal(signal.SIGTERM)
            return "SIGTERM to every launcher"
        if kind == "kill-all":
            for node in nodes:
                if node.current().poll() is None:
                    node.launchers[-1][2] = True
                    node.current().kill()
                    node.current().wait()
            return "SIGKILL every launcher"
        raise AssertionError(kind)

    # --- one attempt --------------------------------------------------------------------
    def run_attempt(self, attempt, faulty):
        nodes = [Node(rank) for rank in range(self.slots)]
        for node in nodes:
            self.write_gpu(node.rank, healthy=True)  # a retry runs on healthy hosts
            self.start_launcher(node, attempt)
        started = time.time()
        injected = []
        pending = self.schedule(faulty)
        ended_by_fault = None
        while time.time() - started < ATTEMPT_DEADLINE_S:
            if all(node.current().poll() is not None for node in nodes):
                break
            if nodes[0].current().poll() == 75 and ended_by_fault is None:
                ended_by_fault = "gpu-lost"  # node 0 could not train and no spare was ready: the job ends
            self.recreate_failed_followers(nodes, attempt, ended_by_fault)
            if pending and time.time() - started >= pending[0]["at"] and ended_by_fault is None:
                fault = pending.pop(0)
                try:
                    what = self.inject(fault, nodes, attempt)
                except (OSError, subprocess.SubprocessError) as error:  # the soak's own failure, not the product's
                    self.violation("soak-error", attempt, "injecting %s failed: %r" % (fault["kind"], error))
                    what = None
                kind = fault["kind"]
                if what is None:
                    log("  seed %d attempt %d: %s: nothing to hit" % (self.seed, attempt, kind))
                else:
                    injected.append((kind, what, time.time()))
                    self.faults[kind] = self.faults.get(kind, 0) + 1
                    log("  seed %d attempt %d +%.1f s: %s (%s)" % (self.seed, attempt, time.time() - started, what, kind))
                    if not FAULTS[kind][1]:
                        ended_by_fault = kind
            if ended_by_fault == "kill-all":
                break
            time.sleep(0.05)
        else:
            for node in nodes:
                node.current().kill()
            self.violation("hang", attempt, "the launchers still ran %d s after the attempt started (faults: %s)" %
                           (ATTEMPT_DEADLINE_S, [w for _, w, _ in injected]))
        for node in nodes:
            try:
                node.current().wait(timeout=10)
            except subprocess.TimeoutExpired:
                node.current().kill()
                node.current().wait()
        return nodes, injected, ended_by_fault

    def recreate_failed_followers(self, nodes, attempt, ended_by_fault):
        """Kubernetes recreates a failed pod in its index (backoffLimitPerIndex): a follower
        whose launcher failed while node 0 still runs the job gets a new one in its slot.
        Not once a fault that ends the job struck (node 0 lost, SIGTERM, every launcher killed)."""
        if ended_by_fault is not None or nodes[0].current().poll() is not None:
            return
        with open(nodes[0].launchers[-1][1], "rb") as f:
            if b"aborting the job" in f.read():  # the job is ending: its pods are not recreated
                return
        for node in nodes[1:]:
            process, _, killed = node.launchers[-1]
            code = process.poll()
            # 69: it lost node 0 (a pod that failed); 75: it cannot train (a new pod on a healthy host)
            if code not in (69, 75) or killed or len(node.launchers) > 3:
                continue
            if not hasattr(process, "failed_at"):
                process.failed_at = time.time()
                continue
            if time.time() - process.failed_at >= 1.5 and nodes[0].current().poll() is None:
                log("  seed %d attempt %d: node %d's launcher exited %d while node 0 runs: a new one in its slot" %
                    (self.seed, attempt, node.rank, code))
                if code == 75:
                    self.write_gpu(node.rank, healthy=True)
                self.start_launcher(node, attempt)

    def violation(self, invariant, attempt, text):
        if any(v[0] == invariant and v[2] == text for v in self.violations):
            return  # a record seen again after a later attempt
        self.violations.append((invariant, attempt, text))
        log("  VIOLATION seed %d attempt %d [%s]: %s" % (self.seed, attempt, invariant, text))

    # --- the checks ---------------------------------------------------------------------
    def ledger(self):
        entries = []
        for rank in range(NODES):
            path = os.path.join(self.ledgers, "ledger-%d.jsonl" % rank)
            for line in open(path) if os.path.exists(path) else []:
                try:
                    entries.append(json.loads(line))
                except ValueError:
                    pass  # a trainer SIGKILLed mid-line
        return entries

    def check_attempt(self, attempt, nodes, injected, ended_by_fault):
        # no-survivors: the guard kills a dead launcher's job; give it a moment.
        deadline = time.time() + 5
        while time.time() < deadline and any(self.hosts.pids(n) for n in range(self.slots)):
            time.sleep(0.2)
        for rank in range(self.slots):
            left = self.hosts.pids(rank)
            if left:
                table = processes()
                names = [table.get(p, (b"?", 0))[0].replace(b"\0", b" ").decode(errors="replace")[:120] for p in left]
                self.violation("no-survivors", attempt, "node %d's host still runs %s after its launchers exited" %
                               (rank, names))
                self.signal_pids(left, signal.SIGKILL)
        self.destination.sample()
        codes = {}
        for node in nodes:
            process, path, killed = node.launchers[-1]
            if not killed:
                # A launcher the orchestrator's SIGTERM reached before it set its handlers (a
                # replacement just started) dies of the signal: 143 to the orchestrator too.
                code = process.returncode if process.returncode >= 0 else 128 - process.returncode
                codes[node.rank] = (code, path)
        everything = [entry for entry in self.ledger() if entry["attempt"] == attempt]
        # A follower cut off from node 0 when the orchestrator stopped the job (a partition,
        # or its launcher frozen past the heartbeat timeout, then SIGTERM or the like, before
        # a new launcher took its slot) cannot learn the job's verdict: it ends as having lost
        # node 0 (69). The nodes that reach node 0 agree on theirs; it is held to 69.
        for rank in self.cut_off_at_the_end(nodes, injected, ended_by_fault):
            if codes.get(rank, (None,))[0] == 69:
                del codes[rank]
        # A follower killed in its drain once the job was over (node 0 exited 0: every rank had
        # finished): its replacement finds no node 0 to join and ends as a new pod of a
        # finished job does, 69 at join_timeout_s (soak seed 4111), or refused by a node 0
        # still closing its rendezvous (seed 9132, a spare had its rank). Held to that (one
        # that asks while node 0 still knows every node succeeded exits 0).
        if codes.get(0, (None,))[0] == 0:
            for node in nodes[1:]:
                path = node.launchers[-1][1]
                if len(node.launchers) > 1 and codes.get(node.rank, (None,))[0] == 69:
                    with open(path, "rb") as f:
                        if b"rendezvous failed: " in f.read():
                            del codes[node.rank]
        # A spare cut off from node 0 (a partition, a freeze) while the job went on without it
        # ends as having lost node 0 (69), though the job succeeded (soak seed 9628): it ran no
        # rank, so nothing of the job's was lost with it. Held to that.
        if codes.get(0, (None,))[0] == 0:
            for node in nodes[1:]:
                code, path = codes.get(node.rank, (None, None))
                if code != 69:
                    continue
                with open(path, "rb") as f:
                    text = f.read()
                last = text.rstrip().rsplit(b"\n", 1)[-1]
                if b" spare]" in last and b"leader (node 0) lost" in text:
                    del codes[node.rank]
        # A node that cannot train exits 75 (its pod is replaced): its code is not the job's.
        for rank in [rank for rank, (code, _) in codes.items() if code == 75]:
            del codes[rank]
        if len(set(code for code, _ in codes.values())) > 1:
            self.violation("exit-codes", attempt, "the nodes' last launchers exited %s" %
                           {rank: code for rank, (code, _) in codes.items()})
        self.check_commits(attempt)
        self.check_verify(attempt)
        self.check_cycles(attempt, everything)
        done = [entry for entry in everything if entry["event"] == "done"]
        final = {code for code, _ in codes.values()}
        if ended_by_fault is None and (final != {0} or len({e["rank"] for e in done}) != NODES):
            self.violation("recovers", attempt, "faults a restart absorbs (%s) ended the job: exit codes %s, "
                           "ranks done %s; logs: %s" % ([w for _, w, _ in injected],
                                                        {r: c for r, (c, _) in codes.items()},
                                                        sorted({e["rank"] for e in done}),
                                                        [p for _, p in codes.values()]))
        saved = [e["step"] for e in everything if e["event"] == "save" and e["rank"] == 0]
        if final == {0} and done and saved:
            latest = (self.destination.read("latest") or b"").decode().strip()
            if (step_of(latest) or 0) < max(saved):
                self.violation("recovers", attempt, "the job ended 0 after saving step %d, but latest is %r: its last "
                               "save was never committed" % (max(saved), latest))
        return final == {0} and len({e["rank"] for e in done}) == NODES

    @staticmethod
    def cut_off_at_the_end(nodes, injected, ended_by_fault):
        if ended_by_fault is None:
            return set()
        cut_off = set()
        for kind, what, healed in injected:
            match = re.match(r"node (\d+)'s link down|SIGSTOP launcher of node (\d+)", what or "")
            if kind in ("partition-follower", "stop-follower-launcher") and match:
                rank = int(match.group(1) or match.group(2))
                if nodes[rank].launchers[-1][0].started_at < healed:  # no launcher came in its slot since
                    cut_off.add(rank)
        return cut_off

    def expected_ranks(self):
        return {"0", "1", "2"} if self.savers == "all" else {"0"}

    def check_commits(self, attempt):
        with self.destination.lock:
            records = list(self.destination.records.values())
        for seen, record, parts in records:
            name = record.get("name")
            if not isinstance(name, str) or step_of(name) is None:
                self.violation("one-save", attempt, "a commit record names %r, which the training never saved "
                               "(its load folder?)" % (name,))
                continue
            ranks = set(record.get("parts", {}))
            failed = {str(e["rank"]) for e in self.ledger() if e["event"] == "save-failed" and e.get("marker")
                      and e["step"] == step_of(name)}  # its marker, written last, hit the full disk
            if ranks | failed != self.expected_ranks():
                self.violation("one-save", attempt, "%s is committed with parts of ranks %s, the training saved "
                               "ranks %s: %s" % (name, sorted(ranks), sorted(self.expected_ranks()), record))
            saves = {(p["step"], p["cycle"], p["attempt"]) if p else None for p in parts.values()}
            if None in saves:
                self.violation("one-save", attempt, "%s: a committed part has no shard.json: %s" % (name, record))
            if len(saves - {None}) > 1:
                self.violation("one-save", attempt, "%s mixes saves (step, cycle, attempt) %s across ranks: %s" %
                               (name, sorted(saves - {None}), {r: p for r, p in parts.items()}))
            if any(s and s[0] != step_of(name) for s in saves):
                self.violation("one-save", attempt, "%s holds a shard of another step: %s" % (name, parts))
        latest = (self.destination.read("latest") or b"").decode().strip()
        if latest:
            commits = self.destination.commits_by_name()
            if latest not in commits:
                self.violation("latest-verified", attempt, "latest names %r, which has no commit record" % latest)
        # versions-immutable
        with self.destination.lock:
            versions = dict(self.destination.versions)
        for (rank, version), digest in versions.items():
            now = hash_tree(os.path.join(self.destination.job, "rank-%s" % rank, ".bt-versions", version))
            if now != digest:
                self.violation("versions-immutable", attempt, "rank %s version %s %s" %
                               (rank, version, "vanished" if now is None else "changed after it was committed"))
                with self.destination.lock:
                    self.destination.versions[(rank, version)] = now
        with self.destination.lock:
            found, self.destination.violations = self.destination.violations, []
        for invariant, text in found:
            self.violation(invariant, attempt, text)

    def check_verify(self, attempt):
        if not os.path.exists(os.path.join(self.destination.job, "latest")):
            return
        environment = dict(os.environ, TMPDIR=os.path.join(self.work, "tmp"),
                           **(self.object_store.launcher_env if self.object_store else {}))
        environment.pop("AWS_CA_BUNDLE", None)
        result = subprocess.run([self.binary, "checkpoints", "--destination", self.destination_uri, "--job-id",
                                 self.job_id, "--verify", "--format", "json"], capture_output=True, text=True,
                                timeout=120, env=environment)
        if result.returncode != 0:
            self.violation("latest-verified", attempt, "checkpoints --verify exited %d: %s" %
                           (result.returncode, (result.stderr or result.stdout)[-600:]))

    def check_cycles(self, attempt, entries):
        starts = [e for e in entries if e["event"] == "start"]
        by_cycle = {}
        for entry in starts:
            by_cycle.setdefault(entry["cycle"], []).append(entry)
        cycles = sorted(by_cycle)
        if cycles and cycles[-1] > MAX_RESTARTS:
            self.violation("restart-budget", attempt, "cycle %d ran with max_restarts %d" % (cycles[-1], MAX_RESTARTS))
        decisions = [line for _, a, line in self.decisions if a == attempt]
        if cycles and len(decisions) < cycles[-1]:
            self.violation("restart-budget", attempt, "cycle %d ran after %d decision(s) of node 0" %
                           (cycles[-1], len(decisions)))
        # One failure, one restart: a decision for a cycle that then never ran, other than
        # the last (the job may end while it prepares), spent the budget on nothing. A cycle
        # ran once its barrier passed, though its trainings may have died before their first
        # ledger line (a replacement killed just after the barrier).
        ran = sorted(set(cycles) | {c for a, c in self.cycles_started if a == attempt})
        if ran and ran != list(range(ran[0], ran[-1] + 1)):
            self.violation("restart-budget", attempt, "cycles %s skip a number" % ran)
        if ran and len(decisions) > ran[-1] + 1:
            self.violation("restart-budget", attempt, "node 0 decided %d restarts, cycles %s ran: %s" %
                           (len(decisions), ran, [line.split("warning: ", 1)[-1][:120] for line in decisions]))
        for cycle, group in sorted(by_cycle.items()):
            for entry in group:
                if not entry.get("secret_seen"):
                    self.violation("no-secret", attempt, "node %d cycle %d did not get the secret's value" %
                                   (entry["rank"], cycle))
            loaded = {}
            for entry in group:
                if entry["rank"] != 0 and self.savers != "all":
                    if entry["entries"]:
                        self.violation("resume-newest", attempt, "node %d (no part) found %s in its load folder" %
                                       (entry["rank"], entry["entries"]))
                    continue
                got = entry["loaded"]
                key = (got["step"], got["cycle"], got["attempt"]) if got else None
                if entry["resume"] and got is None:
                    self.violation("resume-newest", attempt, "node %d cycle %d was told to resume from %s but its "
                                   "load folder holds %s" % (entry["rank"], cycle, entry["resume"], entry["entries"]))
                if got and got.get("rank") != entry["rank"]:
                    self.violation("resume-newest", attempt, "node %d cycle %d loaded rank %s's shard" %
                                   (entry["rank"], cycle, got.get("rank")))
                loaded[entry["rank"]] = (entry["resume"], key)
            resumes = {entry["resume"] for entry in group}
            if len(resumes) > 1 or len(set(loaded.values())) > 1:
                self.violation("resume-newest", attempt, "cycle %d: the nodes resumed from different saves: %s" %
                               (cycle, {e["rank"]: (e["resume"], e["loaded"]) for e in group}))
            resume = resumes.pop() if len(resumes) == 1 else None
            # The newest commit seen before node 0 decided this cycle (or, for an attempt's
            # first cycle, before its trainers started) is the least it may resume from.
            if cycle > (cycles[0] if cycles else 0):
                moments = [t for t, a, line in self.decisions if a == attempt and
                           re.search(r"every node runs cycle %d\b" % cycle, line)]
                decided = moments[0] - 0.5 if moments else None
            else:
                # What a restarted job's launchers settle (the saves left open) is committed
                # before any training starts: everything committed before the last of this
                # cycle's trainers started (its own saves need every rank) is the floor.
                decided = max(e["t"] for e in group)
            floor = self.destination.latest_before(decided) if decided else None
            if floor and (step_of(resume) or 0) < (step_of(floor) or 0):
                self.violation("resume-newest", attempt, "cycle %d resumed from %r though %s was committed and "
                               "latest before the decision" % (cycle, resume, floor))
            if resume and resume not in self.destination.commits_by_name():
                self.violation("resume-newest", attempt, "cycle %d resumed from %r, which no commit record names" %
                               (cycle, resume))

    def check_logs(self):
        needle = self.secret.encode()
        for folder in (self.logs, self.ledgers, self.work):
            for directory, _, files in os.walk(folder):
                if "remote" in directory.split(os.sep) or directory.startswith(os.path.join(self.work, "secrets")):
                    continue
                for name in files:
                    path = os.path.join(directory, name)
                    if path.startswith(os.path.join(self.work, "secrets")) or name == "job.json":
                        continue
                    try:
                        with open(path, "rb") as f:
                            if needle in f.read():
                                self.violation("no-secret", -1, "the secret's value is in %s" % path)
                    except OSError:
                        pass
        for line in self.cmdline_leaks:
            self.violation("no-secret", -1, "the secret's value is on a command line: %s" % line)

    # --- the run ------------------------------------------------------------------------
    def run(self):
        self.prepare()
        attempt_holder = [0]
        sampler = threading.Thread(target=self.sampler, args=(attempt_holder,), daemon=True)
        sampler.start()
        try:
            for attempt in range(ATTEMPTS):
                attempt_holder[0] = attempt
                faulty = attempt < ATTEMPTS - 1
                nodes, injected, ended_by_fault = self.run_attempt(attempt, faulty)
                codes = {n.rank: n.launchers[-1][0].returncode for n in nodes}
                log("  seed %d attempt %d ended: exit codes %s%s" % (self.seed, attempt, codes,
                                                                      " (by %s)" % ended_by_fault if ended_by_fault else ""))
                finished = self.check_attempt(attempt, nodes, injected, ended_by_fault)
                if finished:
                    break
        finally:
            self.stop_sampler.set()
            sampler.join()
            if self.object_store:
                self.object_store.close()
        self.check_logs()
        return self.violations


def replay_command(binary, seed):
    extra = " --destination s3" if DESTINATION[0] == "s3" else ""
    return "sudo python3 %s %s --seed %d%s" % (os.path.abspath(__file__), binary, seed, extra)


DESTINATION = ["file"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("binary")
    parser.add_argument("--seeds", type=int, default=int(os.environ.get("SOAK", "3")))
    parser.add_argument("--seed", type=int, help="replay this seed only")
    parser.add_argument("--first-seed", type=int, default=int(os.environ.get("SOAK_FIRST_SEED", "1")))
    parser.add_argument("--keep", action="store_true", help="keep each seed's work folder")
    parser.add_argument("--destination", choices=("file", "s3"), default=os.environ.get("SOAK_DESTINATION", "file"),
                        help="file:// (default) or s3 through rclone to moto_server on the bridge")
    args = parser.parse_args()
    binary = os.path.realpath(args.binary)
    DESTINATION[0] = args.destination
    if args.destination == "s3" and (shutil.which("rclone") is None or shutil.which("moto_server") is None):
        print("SKIPPED: rclone or moto_server is not installed")
        return 77
    if os.geteuid() != 0:
        print("SKIPPED: network namespaces and tmpfs mounts need root")
        return 77
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        print("SKIPPED: iproute2 or unshare is not installed")
        return 77
    probe = "bsprobe%d" % (os.getpid() % 100000)
    if subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode != 0:
        print("SKIPPED: cannot create network namespaces here")
        return 77
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)

    signal.signal(signal.SIGTERM, lambda number, frame: sys.exit(128 + number))  # clean up, then exit
    sweep_leftovers()
    seeds = [args.seed] if args.seed is not None else list(range(args.first_seed, args.first_seed + args.seeds))
    totals, failed, started = {}, [], time.time()
    for seed in seeds:
        work = tempfile.mkdtemp(prefix="bt-soak-%d." % seed)
        with open(os.path.join(work, ".running"), "w") as f:  # sweep_leftovers spares its mounts while it runs
            f.write(str(os.getpid()))
        hosts = Hosts(work)
        begun = time.time()
        try:
            hosts.create()
            soak = Soak(binary, seed, work, hosts, args)
            log("seed %d: %s saving%s, work %s" % (seed, "only rank 0" if soak.savers != "all" else "every rank",
                                                   ", a hot spare" if soak.spares else "", work))
            violations = soak.run()
        finally:
            hosts.destroy()
            os.unlink(os.path.join(work, ".running"))
        for kind, count in soak.faults.items():
            totals[kind] = totals.get(kind, 0) + count
        if violations:
            failed.append((seed, violations))
            log("seed %d FAILED (%d violation(s), %.0f s); logs kept in %s; replay: %s" %
                (seed, len(violations), time.time() - begun, work, replay_command(binary, seed)))
        else:
            log("seed %d ok (%.0f s, faults %s)" % (seed, time.time() - begun, soak.faults))
            if not args.keep:
                shutil.rmtree(work, ignore_errors=True)
    log("%d seed(s) in %.0f s; faults by kind: %s; violations: %d in %d seed(s)" %
        (len(seeds), time.time() - started, json.dumps(totals, sort_keys=True),
         sum(len(v) for _, v in failed), len(failed)))
    for seed, violations in failed:
        kinds = sorted({invariant for invariant, _, _ in violations})
        log("FAIL seed %d (%s): %s" % (seed, ", ".join(kinds), replay_command(binary, seed)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
