#!/usr/bin/python3
"""The orchestrator examples under examples/, each run the way its orchestrator runs it.

Every scenario starts real bt-launch processes with the variables that orchestrator really
sets, and checks that the nodes agree on ranks, count and leader and complete a rendezvous:

  kubernetes-indexed-job   examples/kubernetes/{config,indexed-job}.yaml: each pod in its own
                           network namespace, the headless Service's names in its hosts file,
                           JOB_COMPLETION_INDEX and HOSTNAME as Kubernetes sets them, the
                           container's command and env (ConfigMap and Secret refs resolved)
  kubernetes-two-indexed-jobs
                           indexed-job.yaml and a copy with only the Job renamed, in one
                           namespace (one token Secret): the copy's pods are refused by name
  kubernetes-lws           examples/kubernetes/leaderworkerset.yaml: LWS_LEADER_ADDRESS,
                           LWS_GROUP_SIZE, LWS_WORKER_INDEX as the LWS webhook sets them
  slurm                    examples/slurm/train.sbatch run as sbatch would (SLURM_JOB_* with a
                           compressed hostlist), its srun answered by a stand-in that starts one
                           task per node namespace with srun's per-task SLURM_* variables
  mpirun                   examples/mpirun/run.sh with Debian's real mpirun
  dockerfile               examples/Dockerfile's build steps are the README's, and they build:
                           run outside Docker (no daemon here), paths mapped, then the
                           ENTRYPOINT starts a job. When the tests' own build is a Release
                           Ninja build of this tree (scripts/test.sh's), its `cmake --build`
                           is not run again: every command it would run must be one that
                           build ran (with -Werror), and every file those compiles read must
                           be in the copy; the install step installs the tests' build
  manifests                the manifests parse and agree with each other and with the config

`torchrun` is a recording stand-in on PATH (the real one runs in demo.train_and_resume): it
writes its arguments and environment so the test can compare what each node was given.
Exit 77 (SKIPPED) where the machine cannot run a scenario; every process has a deadline and
everything created is removed.
"""
import fnmatch
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import yaml

SKIP = 77
SOURCE = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))
EXAMPLES = os.path.join(SOURCE, "examples")
DEADLINE_S = 90

TORCHRUN_STAND_IN = """#!/usr/bin/python3
import json, os, socket, sys, time
record = {"argv": sys.argv[1:], "env": dict(os.environ), "hostname": socket.gethostname(),
          "master_ip": socket.gethostbyname(os.environ["MASTER_ADDR"])}
with open(os.path.join(os.environ["RECORD_DIR"], "torchrun-%s.json" % os.environ["BT_NODE_RANK"]), "w") as out:
    json.dump(record, out)
hold = os.environ.get("HOLD_UNTIL")  # a test keeping the job running until this file exists
for _ in range(600 if hold else 0):
    if os.path.exists(hold):
        break
    time.sleep(0.1)
"""


class Failure(Exception):
    pass


def check(condition, message):
    if not condition:
        raise Failure(message)


def load_yaml(name):
    with open(os.path.join(EXAMPLES, "kubernetes", name)) as stream:
        return [document for document in yaml.safe_load_all(stream) if document]


def find(documents, kind):
    matches = [document for document in documents if document["kind"] == kind]
    check(len(matches) == 1, f"expected one {kind}, found {len(matches)}")
    return matches[0]


class Workspace:
    """A temporary folder with bin/ (bt-launch, the torchrun stand-in) and records/."""

    def __init__(self, binary):
        self.path = tempfile.mkdtemp(prefix="bt-orchestrators.")
        self.bin = os.path.join(self.path, "bin")
        self.records = os.path.join(self.path, "records")
        os.makedirs(self.bin)
        os.makedirs(self.records)
        os.symlink(binary, os.path.join(self.bin, "bt-launch"))
        self.write(os.path.join(self.bin, "torchrun"), TORCHRUN_STAND_IN, mode=0o755)
        # The examples name real buckets, and these hosts reach none: an empty bucket stands in
        # (rclone's exit 3, "not found", for any read), so the start finds no `latest` instead
        # of an unreachable destination (which ends the launch, 74).
        self.write(os.path.join(self.bin, "rclone"), "#!/bin/sh\nexit 3\n", mode=0o755)

    def write(self, path, text, mode=0o644):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as out:
            out.write(text)
        os.chmod(path, mode)
        return path

    def base_env(self):
        """What a container starts with: a PATH with bt-launch, no launcher variables of ours."""
        env = {name: value for name, value in os.environ.items()
               if not name.startswith(("BT_", "OMPI_", "PMIX_", "SLURM_", "LWS_", "MASTER_"))}
        env["PATH"] = self.bin + ":/usr/bin:/bin:/usr/sbin:/sbin"
        env["RECORD_DIR"] = self.records
        return env

    def records_by_rank(self, count):
        records = {}
        for rank in range(count):
            path = os.path.join(self.records, f"torchrun-{rank}.json")
            check(os.path.exists(path), f"node {rank} never started its start command (no {path})")
            with open(path) as stream:
                records[rank] = json.load(stream)
        return records

    def remove(self):
        shutil.rmtree(self.path, ignore_errors=True)


class Cluster:
    """Hosts in network namespaces on one bridge; each has its own /etc/hosts (ip netns exec
    bind-mounts /etc/netns/NAME/hosts) holding the names the orchestrator's DNS would serve."""

    def __init__(self, hostnames, dns_names):
        self.tag = f"bto{os.getpid() % 100000}"
        self.hostnames = hostnames
        self.addresses = [f"10.79.0.{10 + i}" for i in range(len(hostnames))]
        self.namespaces = [f"{self.tag}n{i}" for i in range(len(hostnames))]
        self.bridge = f"{self.tag}br"
        self.created = []
        hosts = "127.0.0.1 localhost\n" + "".join(
            f"{address} {' '.join(names)}\n" for address, names in zip(self.addresses, dns_names))
        self.run(["ip", "link", "add", self.bridge, "type", "bridge"])
        self.created.append(("link", self.bridge))
        self.run(["ip", "link", "set", self.bridge, "up"])
        for i, namespace in enumerate(self.namespaces):
            self.run(["ip", "netns", "add", namespace])
            self.created.append(("netns", namespace))
            veth = f"{self.tag}v{i}"
            self.run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", namespace])
            self.run(["ip", "link", "set", veth, "master", self.bridge, "up"])
            self.run(["ip", "-n", namespace, "link", "set", "lo", "up"])
            self.run(["ip", "-n", namespace, "link", "set", "eth0", "up"])
            self.run(["ip", "-n", namespace, "addr", "add", f"{self.addresses[i]}/24", "dev", "eth0"])
            os.makedirs(f"/etc/netns/{namespace}", exist_ok=True)
            with open(f"/etc/netns/{namespace}/hosts", "w") as out:
                out.write(hosts)

    @staticmethod
    def run(argv):
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=30)

    def host_command(self, index, argv):
        """argv run on host `index`: its namespace, and its own host name (a UTS namespace)."""
        script = 'hostname "$0"; exec "$@"'
        return ["ip", "netns", "exec", self.namespaces[index], "unshare", "--uts", "sh", "-c", script,
                self.hostnames[index]] + argv

    def remove(self):
        for namespace in self.namespaces:
            pids = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True).stdout.split()
            for pid in pids:
                subprocess.run(["kill", "-9", pid], stderr=subprocess.DEVNULL)
        for kind, name in reversed(self.created):
            if kind == "netns":
                subprocess.run(["ip", "netns", "del", name], stderr=subprocess.DEVNULL)
                shutil.rmtree(f"/etc/netns/{name}", ignore_errors=True)
            else:
                subprocess.run(["ip", "link", "del", name], stderr=subprocess.DEVNULL)


def require_namespaces():
    if os.geteuid() != 0:
        print("SKIPPED: network namespaces need root")
        sys.exit(SKIP)
    probe = f"btoprobe{os.getpid() % 100000}"
    if subprocess.run(["ip", "netns", "add", probe], stderr=subprocess.DEVNULL).returncode != 0:
        print("SKIPPED: cannot create network namespaces here")
        sys.exit(SKIP)
    subprocess.run(["ip", "netns", "del", probe])


def wait_all(processes, deadline_s=DEADLINE_S):
    """Exit codes of every process (124 for one past the deadline, which is killed)."""
    end = time.monotonic() + deadline_s
    codes = []
    for process in processes:
        try:
            codes.append(process.wait(timeout=max(0.1, end - time.monotonic())))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            codes.append(124)
    return codes


def output_of(workspace, name):
    with open(os.path.join(workspace.path, name)) as stream:
        return stream.read()


def start(workspace, argv, env, log_name, cwd=SOURCE):
    log = open(os.path.join(workspace.path, log_name), "w")
    return subprocess.Popen(argv, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def check_agreement(workspace, count, leader_ip, identity_source, logs):
    """Both nodes ran the start command with one view of the job: ranks 0..count-1, one count,
    one leader, and the leader's name resolving (on every host) to node 0's address."""
    for log in logs:
        text = output_of(workspace, log)
        check(f"rank from {identity_source}" in text, f"{log}: identity not from {identity_source}:\n{text[-3000:]}")
        check(f"all {count} nodes joined" in text, f"{log}: no complete rendezvous:\n{text[-3000:]}")
    records = workspace.records_by_rank(count)
    for rank, record in records.items():
        env, argv = record["env"], record["argv"]
        check(f"--node_rank={rank}" in argv, f"node {rank}: torchrun got {argv}")
        check(f"--nnodes={count}" in argv, f"node {rank}: torchrun got {argv}")
        check(env["BT_NODE_RANK"] == str(rank) and env["NODE_RANK"] == str(rank), f"node {rank}: rank {env['BT_NODE_RANK']}")
        check(env["BT_GROUP_SIZE"] == str(count), f"node {rank}: group size {env['BT_GROUP_SIZE']}")
        check(record["master_ip"] == leader_ip, f"node {rank}: MASTER_ADDR {env['MASTER_ADDR']} is {record['master_ip']}, "
                                                f"not node 0's {leader_ip}")
        check("BT_RENDEZVOUS_TOKEN" not in env, f"node {rank}: the rendezvous token reached the job")
    leaders = {record["env"]["MASTER_ADDR"] for record in records.values()}
    check(len(leaders) == 1, f"the nodes disagree on the leader: {leaders}")
    return records


# --- Kubernetes -------------------------------------------------------------------------

def container_env(container, config_maps, secrets):
    """A container's env list as the kubelet resolves it (value, configMapKeyRef, secretKeyRef)."""
    env = {}
    for entry in container.get("env", []):
        if "value" in entry:
            env[entry["name"]] = str(entry["value"])
            continue
        source = entry["valueFrom"]
        if "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            env[entry["name"]] = config_maps[ref["name"]]["data"][ref["key"]]
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            env[entry["name"]] = secrets[ref["name"]][ref["key"]]
        else:
            raise Failure(f"env {entry['name']}: unsupported valueFrom {source}")
    return env


def kubernetes_secrets(workspace):
    """The secrets config.yaml tells users to create; the `secrets` volume becomes BT_SECRETS_DIR."""
    secrets_dir = os.path.join(workspace.path, "secrets")
    workspace.write(os.path.join(secrets_dir, "aws_credentials"), json.dumps(
        {"aws_access_key_id": "AKIAEXAMPLE", "aws_secret_access_key": "example-secret-key", "aws_region": "us-east-1"}))
    return {"bt-rendezvous": {"token": "k8s-" + os.urandom(16).hex()}}, secrets_dir


def volume_env(container, secrets_dir):
    mounts = {mount["name"]: mount["mountPath"] for mount in container.get("volumeMounts", [])}
    check(mounts.get("secrets") == "/secrets", "the secrets volume must be mounted at /secrets (BT_SECRETS_DIR's default)")
    check(mounts.get("dshm") == "/dev/shm", "/dev/shm must be a memory volume (Docker's 64 MiB default breaks NCCL)")
    return {"BT_SECRETS_DIR": secrets_dir}


def run_pods(workspace, cluster, container, pod_env, config_maps, while_running=None):
    """Exit codes of the pods; `while_running` is called once every pod has started."""
    secrets, secrets_dir = kubernetes_secrets(workspace)
    processes = []
    for index in range(len(cluster.hostnames)):
        env = workspace.base_env()
        env.update(container_env(container, config_maps, secrets))
        env.update(volume_env(container, secrets_dir))
        env.update(pod_env(index))
        env["HOSTNAME"] = cluster.hostnames[index]
        env["BT_ROOT"] = os.path.join(workspace.path, f"pod-{index}")  # each pod's own filesystem
        argv = container["command"] + container.get("args", [])
        processes.append(start(workspace, cluster.host_command(index, argv), env, f"pod-{index}.log"))
    if while_running:
        while_running()
    return wait_all(processes)


def config_node_count(config_maps):
    return json.loads(config_maps["trainer-config"]["data"]["job.json"])["compute"]["node_count"]


def scenario_kubernetes_indexed_job(binary):
    require_namespaces()
    config_maps = {"trainer-config": find(load_yaml("config.yaml"), "ConfigMap")}
    documents = load_yaml("indexed-job.yaml")
    job, service = find(documents, "Job"), find(documents, "Service")
    count = job["spec"]["completions"]
    pod = job["spec"]["template"]["spec"]
    subdomain = pod["subdomain"]
    # Kubernetes: hostname <job>-<index>; with the headless Service as subdomain, DNS serves
    # <job>-<index>.<service> (and the fully qualified names).
    hostnames = [f"{job['metadata']['name']}-{i}" for i in range(count)]
    dns = [[f"{name}.{subdomain}", f"{name}.{subdomain}.default.svc.cluster.local", name] for name in hostnames]
    check(subdomain == service["metadata"]["name"], "the pods' subdomain is not the headless Service")
    workspace = Workspace(binary)
    cluster = Cluster(hostnames, dns)
    try:
        codes = run_pods(workspace, cluster, pod["containers"][0], lambda i: {"JOB_COMPLETION_INDEX": str(i)}, config_maps)
        check(codes == [0] * count, f"pods exited {codes}:\n" + output_of(workspace, "pod-1.log")[-3000:])
        records = check_agreement(workspace, count, cluster.addresses[0], "Kubernetes Indexed Job",
                                  [f"pod-{i}.log" for i in range(count)])
        check(records[1]["env"]["MASTER_ADDR"] == "trainer-0.trainer", "MASTER_ADDR is not the leader pod's DNS name")
        check(records[0]["env"]["NPROC_PER_NODE"] == "8", "NPROC_PER_NODE is not compute.accelerator's 8")
    finally:
        cluster.remove()
        workspace.remove()


def scenario_kubernetes_two_indexed_jobs(binary):
    """Two Indexed Jobs of one config in one namespace: indexed-job.yaml, and a copy whose Job
    is renamed and nothing else (one ConfigMap, one token Secret, the copied BT_LEADER_ADDR).
    The copy's pods reach the first job's leader holding its token: they are refused, naming
    both jobs, and the first job trains undisturbed."""
    require_namespaces()
    config_maps = {"trainer-config": find(load_yaml("config.yaml"), "ConfigMap")}
    job = find(load_yaml("indexed-job.yaml"), "Job")
    name, count = job["metadata"]["name"], job["spec"]["completions"]
    copy_name = name + "-b"
    pod = job["spec"]["template"]["spec"]
    subdomain = pod["subdomain"]
    hostnames = [f"{job_name}-{i}" for job_name in (name, copy_name) for i in range(count)]
    dns = [[f"{host}.{subdomain}", f"{host}.{subdomain}.default.svc.cluster.local", host] for host in hostnames]
    workspace = Workspace(binary)
    cluster = Cluster(hostnames, dns)
    refusal = f"this node is of job k8s-{copy_name}, but the leader serves job k8s-{name}"
    release = os.path.join(workspace.path, "release-the-first-job")

    # The first job trains until every copied pod was refused: ended earlier, a copied pod
    # whose retry came late would find no leader at all (a busy machine slows the first tries).
    def hold_the_first_job_until_refused():
        for _ in range(600):
            if all(refusal in output_of(workspace, f"pod-{index}.log") for index in range(count, 2 * count)):
                break
            time.sleep(0.1)
        with open(release, "w"):
            pass

    try:
        codes = run_pods(workspace, cluster, pod["containers"][0],
                         lambda i: {"JOB_COMPLETION_INDEX": str(i % count), **({"HOLD_UNTIL": release} if i < count else {})},
                         config_maps, hold_the_first_job_until_refused)
        check(codes[:count] == [0] * count, f"the first job's pods exited {codes[:count]}:\n" +
              output_of(workspace, "pod-1.log")[-3000:])
        records = check_agreement(workspace, count, cluster.addresses[0], "Kubernetes Indexed Job",
                                  [f"pod-{i}.log" for i in range(count)])
        check({record["env"]["BT_TRAINING_JOB_ID"] for record in records.values()} == {f"k8s-{name}"},
              f"the first job's id is not k8s-{name}")
        for index in range(count, 2 * count):
            log = output_of(workspace, f"pod-{index}.log")
            check(codes[index] != 0, f"pod {hostnames[index]} of the copied job exited 0:\n{log[-3000:]}")
            check(refusal in log, f"pod {hostnames[index]} is not refused naming both jobs:\n{log[-3000:]}")
    finally:
        cluster.remove()
        workspace.remove()


def scenario_kubernetes_lws(binary):
    require_namespaces()
    config_maps = {"trainer-config": find(load_yaml("config.yaml"), "ConfigMap")}
    lws = find(load_yaml("leaderworkerset.yaml"), "LeaderWorkerSet")
    name, size = lws["metadata"]["name"], lws["spec"]["leaderWorkerTemplate"]["size"]
    # LWS: leader pod <lws>-<group>, workers <lws>-<group>-<index>; the leader's address is
    # <lws>-<group>.<lws>.<namespace> (Shared subdomain).
    leader_address = f"{name}-0.{name}.default"
    hostnames = [f"{name}-0"] + [f"{name}-0-{i}" for i in range(1, size)]
    dns = [[f"{host}.{name}.default", f"{host}.{name}.default.svc.cluster.local", host] for host in hostnames]
    pod = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]

    def lws_env(index):
        return {"LWS_LEADER_ADDRESS": leader_address, "LWS_GROUP_SIZE": str(size), "LWS_WORKER_INDEX": str(index)}

    workspace = Workspace(binary)
    cluster = Cluster(hostnames, dns)
    try:
        codes = run_pods(workspace, cluster, pod["containers"][0], lws_env, config_maps)
        check(codes == [0] * size, f"pods exited {codes}:\n" + output_of(workspace, "pod-1.log")[-3000:])
        records = check_agreement(workspace, size, cluster.addresses[0], "Kubernetes LeaderWorkerSet",
                                  [f"pod-{i}.log" for i in range(size)])
        check(records[1]["env"]["MASTER_ADDR"] == leader_address, "MASTER_ADDR is not LWS_LEADER_ADDRESS")
    finally:
        cluster.remove()
        workspace.remove()


# --- Slurm ------------------------------------------------------------------------------

SRUN_STAND_IN = """#!/usr/bin/python3
# srun, for one job step of one task per node: each task on its node's host (a network
# namespace), with the per-task variables srun sets; --kill-on-bad-exit=1 honoured; exits
# with the highest task exit code, as srun does.
import json, os, subprocess, sys, time
cluster = json.loads(os.environ["TEST_CLUSTER"])
args = sys.argv[1:]
options = {}
while args and args[0].startswith("-"):
    key, _, value = args.pop(0).partition("=")
    options[key] = value
nodes = len(cluster["host_commands"])
assert options.get("--ntasks-per-node", "1") == "1", options
tasks = []
for node, prefix in enumerate(cluster["host_commands"]):
    env = dict(os.environ, SLURM_PROCID=str(node), SLURM_NODEID=str(node), SLURM_LOCALID="0",
               SLURM_NTASKS=str(nodes), SLURM_NPROCS=str(nodes), SLURM_STEP_ID="0", SLURM_STEPID="0",
               SLURM_STEP_NODELIST=os.environ["SLURM_JOB_NODELIST"], SLURM_STEP_NUM_NODES=str(nodes),
               SLURM_STEP_NUM_TASKS=str(nodes), SLURMD_NODENAME=cluster["hostnames"][node],
               BT_ROOT=os.path.join(cluster["workspace"], "node-disk-%d" % node))
    log = open(os.path.join(cluster["workspace"], "task-%d.log" % node), "w")
    tasks.append(subprocess.Popen(prefix + args, env=env, stdout=log, stderr=subprocess.STDOUT))
codes = {}
while len(codes) < len(tasks):
    for i, task in enumerate(tasks):
        if i not in codes and task.poll() is not None:
            codes[i] = task.returncode
            if task.returncode != 0 and options.get("--kill-on-bad-exit") == "1":
                for other in tasks:
                    if other.poll() is None:
                        other.kill()
    time.sleep(0.05)
sys.exit(max(codes.values()))
"""


def sbatch_options(script):
    options = {}
    for line in open(script):
        match = re.match(r"#SBATCH\s+(--[\w-]+)(?:=(\S+))?", line)
        if match:
            options[match.group(1)] = match.group(2)
    return options


def scenario_slurm(binary):
    require_namespaces()
    script = os.path.join(EXAMPLES, "slurm", "train.sbatch")
    options = sbatch_options(script)
    count = int(options["--nodes"])
    check(options.get("--ntasks-per-node") == "1", "one bt-launch per node: --ntasks-per-node=1")
    hostnames = [f"gpu{i + 1:02d}" for i in range(count)]
    nodelist = f"gpu[01-{count:02d}]"  # compressed, as Slurm writes it
    workspace = Workspace(binary)
    cluster = Cluster(hostnames, [[name] for name in hostnames])
    try:
        workspace.write(os.path.join(workspace.bin, "srun"), SRUN_STAND_IN, mode=0o755)
        env = workspace.base_env()
        env.update({"SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": options.get("--job-name", "trainer"),
                    "SLURM_JOB_NODELIST": nodelist, "SLURM_NODELIST": nodelist, "SLURM_JOB_NUM_NODES": str(count),
                    "SLURM_NNODES": str(count), "SLURM_SUBMIT_DIR": SOURCE,
                    "BT_CONFIG": os.path.join(EXAMPLES, "slurm", "job.json"),
                    # The shared filesystem the example's destination names.
                    "BT_CHECKPOINT_DESTINATION": "file://" + os.path.join(workspace.path, "shared", "checkpoints"),
                    "TEST_CLUSTER": json.dumps({"workspace": workspace.path, "hostnames": hostnames,
                                                "host_commands": [cluster.host_command(i, []) for i in range(count)]})})
        batch = start(workspace, ["bash", script], env, "batch.log")
        codes = wait_all([batch])
        check(codes == [0], f"the batch script exited {codes}:\n" + output_of(workspace, "batch.log")[-2000:] +
              output_of(workspace, "task-1.log")[-3000:])
        records = check_agreement(workspace, count, cluster.addresses[0], "Slurm", [f"task-{i}.log" for i in range(count)])
        for rank, record in records.items():
            env_seen = record["env"]
            check(env_seen["MASTER_ADDR"] == "gpu01", f"node {rank}: MASTER_ADDR {env_seen['MASTER_ADDR']}, not gpu01")
            check(env_seen["BT_TRAINING_JOB_ID"] == "slurm-4242", f"node {rank}: job id {env_seen['BT_TRAINING_JOB_ID']}")
            leaked = sorted(name for name in env_seen if name in ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID")
                            or name.startswith("SLURM_STEP_"))
            check(not leaked, f"node {rank}: srun's task variables reached the job: {leaked}")
            check(env_seen.get("SLURM_JOB_ID") == "4242", f"node {rank}: SLURM_JOB_ID did not reach the job")
    finally:
        cluster.remove()
        workspace.remove()


# --- mpirun -----------------------------------------------------------------------------

def scenario_mpirun(binary):
    if shutil.which("mpirun") is None:
        print("SKIPPED: mpirun is not installed")
        sys.exit(SKIP)
    workspace = Workspace(binary)
    try:
        env = workspace.base_env()
        env["NODES"] = "2"
        env["BT_ROOT"] = os.path.join(workspace.path, "root")
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            env["BT_RENDEZVOUS_PORT"] = str(probe.getsockname()[1])
        env["MPIRUN_ARGS"] = "--oversubscribe -x BT_RENDEZVOUS_PORT -x BT_ROOT -x RECORD_DIR -x PATH" + (
            " --allow-run-as-root" if os.geteuid() == 0 else "")
        run = start(workspace, [os.path.join(EXAMPLES, "mpirun", "run.sh")], env, "mpirun.log")
        codes = wait_all([run])
        check(codes == [0], f"run.sh exited {codes}:\n" + output_of(workspace, "mpirun.log")[-3000:])
        records = check_agreement(workspace, 2, "127.0.0.1", "Open MPI", ["mpirun.log"])
        for rank, record in records.items():
            leaked = sorted(name for name in record["env"] if name.startswith(("OMPI_", "PMIX_", "PRTE_")))
            check(not leaked, f"node {rank}: MPI variables reached the job: {leaked[:5]}")

        # With a hostfile: one rank per listed host, the first host leading. This machine is
        # the only host there is, so the file lists it once (a comment and a blank line too).
        hostfile = workspace.write(os.path.join(workspace.path, "hosts"), "# the job's hosts\n\nlocalhost slots=1\n")
        os.remove(os.path.join(workspace.records, "torchrun-0.json"))
        run = start(workspace, [os.path.join(EXAMPLES, "mpirun", "run.sh"), hostfile], env, "mpirun-hostfile.log")
        codes = wait_all([run])
        check(codes == [0], f"run.sh HOSTFILE exited {codes}:\n" + output_of(workspace, "mpirun-hostfile.log")[-3000:])
        record = workspace.records_by_rank(1)[0]
        check(record["env"]["MASTER_ADDR"] == "localhost" and record["env"]["BT_GROUP_SIZE"] == "1",
              f"the hostfile's first host did not lead a one-node job: {record['env'].get('MASTER_ADDR')}")
    finally:
        workspace.remove()


# --- Dockerfile -------------------------------------------------------------------------

def dockerfile_stages(path):
    """[(base image, [(instruction, argument text)])] with continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", open(path).read())
    stages = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, argument = line.partition(" ")
        if instruction.upper() == "FROM":
            stages.append((argument.split()[0], []))
        else:
            stages[-1][1].append((instruction.upper(), argument.strip()))
    return stages


def readme_build_commands():
    text = open(os.path.join(SOURCE, "README.md")).read()
    match = re.search(r"## Building from source\n(.*?)(\n## |\Z)", text, re.S)
    check(match is not None, "README.md has no '## Building from source' section")
    return [line.strip() for line in match.group(1).splitlines() if line.startswith("    cmake ")]


def scenario_dockerfile(binary):
    stages = dockerfile_stages(os.path.join(EXAMPLES, "Dockerfile"))
    check(len(stages) == 2, f"expected a build and a runtime stage, found {len(stages)}")
    (_, build), (_, runtime) = stages
    build_runs = [argument for instruction, argument in build if instruction == "RUN"]
    cmake_steps = [run for run in build_runs if run.startswith("cmake ")]
    documented = readme_build_commands()
    check(cmake_steps == documented, f"the Dockerfile builds with {cmake_steps}, the README documents {documented}")
    workdir = [argument for instruction, argument in build if instruction == "WORKDIR"]
    copies = [argument.split() for instruction, argument in build if instruction == "COPY"]
    check(workdir == ["/src"] and [".", "/src"] in copies, "the build stage must COPY . /src and build in WORKDIR /src")

    packages = [word for run in build_runs + [a for i, a in runtime if i == "RUN"] if "apt-get install" in run
                for word in run.split("apt-get install", 1)[1].split("&&")[0].split() if not word.startswith("-")]
    unknown = [package for package in packages
               if subprocess.run(["apt-cache", "show", package], capture_output=True).returncode != 0]
    check(not unknown, f"the Dockerfile installs packages Debian does not have: {unknown}")

    # The documented steps, outside Docker: a copy of the tree as /src, --prefix as the image's /usr/local.
    work = tempfile.mkdtemp(prefix="bt-dockerfile.")
    try:
        src, prefix = os.path.join(work, "src"), os.path.join(work, "usr-local")
        ignored = [line.strip() for line in open(os.path.join(SOURCE, ".dockerignore"))
                   if line.strip() and not line.startswith("#")]

        def dockerignore(directory, names):  # what `COPY . /src` leaves out (top-level patterns)
            return [name for name in names if directory == SOURCE and any(fnmatch.fnmatch(name, p) for p in ignored)]
        shutil.copytree(SOURCE, src, symlinks=True, ignore=dockerignore)
        test_build = os.path.dirname(os.path.dirname(binary))  # BUILD/launcher/bt-launch
        reuse = same_build_as_tests(test_build)
        for step in cmake_steps:
            argv = [prefix if word == "/usr/local" else word for word in shlex.split(step)]
            if reuse and argv[:2] == ["cmake", "--build"]:
                check_tests_built_it(test_build, os.path.join(src, argv[argv.index("--build") + 1]), src)
                continue
            if reuse and argv[:2] == ["cmake", "--install"]:
                argv[argv.index("--install") + 1] = test_build
            result = subprocess.run(argv, cwd=src, capture_output=True, text=True, timeout=1200)
            check(result.returncode == 0, f"{step} failed:\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
        for instruction, argument in runtime:
            if instruction == "COPY" and argument.startswith("--from=build"):
                source = argument.split()[1]
                check(os.path.exists(source.replace("/usr/local", prefix, 1)), f"the image would lack {source}")
        entrypoint = json.loads(dict(runtime)["ENTRYPOINT"])
        check(entrypoint[0] == "/usr/local/bin/bt-launch", f"ENTRYPOINT starts {entrypoint[0]}")
        argv = [entrypoint[0].replace("/usr/local", prefix, 1)] + entrypoint[1:] + [
            "--root", os.path.join(work, "root"), "--", "sh", "-c", "echo trained on node $BT_NODE_RANK"]
        env = {name: value for name, value in os.environ.items() if not name.startswith(("BT_", "OMPI_", "SLURM_"))}
        result = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
        check(result.returncode == 0 and "trained on node 0" in result.stdout,
              f"the ENTRYPOINT did not run a job (exit {result.returncode}):\n{result.stderr[-2000:]}")
        plugins = os.listdir(os.path.join(prefix, "lib", "bt-launch"))
        check("libbt_verbs.so" in plugins, f"the verbs plugin is not installed beside the binary's lib: {plugins}")
        check("libbt_metrics.so" in plugins, f"the metrics plugin is not installed beside the binary's lib: {plugins}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def cache_entry(build, name):
    try:
        text = open(os.path.join(build, "CMakeCache.txt")).read()
    except OSError:
        return None
    match = re.search(r"^%s:[A-Z]+=(.*)$" % re.escape(name), text, re.M)
    return match.group(1) if match else None


def same_build_as_tests(test_build):
    """Whether the tests' own build is the documented one plus the tests and -Werror (a Release
    Ninja build of this tree, as scripts/test.sh makes): then the Dockerfile's build is checked
    against it instead of compiled a second time."""
    return (cache_entry(test_build, "CMAKE_GENERATOR") == "Ninja"
            and cache_entry(test_build, "CMAKE_BUILD_TYPE") == "Release"
            and cache_entry(test_build, "BT_SANITIZE") in ("OFF", None)
            and os.path.realpath(cache_entry(test_build, "CMAKE_HOME_DIRECTORY") or "") == SOURCE)


def ninja_commands(build, source):
    """Every command `cmake --build` runs in BUILD, with the build and source paths and the
    warning-as-error flags (the tests' build adds them) taken out."""
    result = subprocess.run(["ninja", "-C", build, "-t", "commands"], capture_output=True, text=True, timeout=120)
    check(result.returncode == 0, f"ninja -t commands in {build} failed: {result.stderr[-2000:]}")
    commands = set()
    for line in result.stdout.splitlines():
        words = [word.replace(build, "BUILD").replace(source, "SRC") for word in shlex.split(line)
                 if word not in ("-Werror", "-Wno-error=restrict")]
        if words and os.path.basename(words[0]) == "ccache":
            words = words[1:]
        commands.add(" ".join(words))
    return commands


def check_tests_built_it(test_build, build, src):
    """The Dockerfile's `cmake --build`, without compiling everything again: every command it
    would run (compiles, archives, links) is one the tests' build ran with -Werror on, and every
    file those compiles read from the tree (ninja's recorded dependencies) is in the copy that
    `COPY . /src` makes."""
    documented = ninja_commands(os.path.realpath(build), os.path.realpath(src))
    built = ninja_commands(os.path.realpath(test_build), SOURCE)
    missing = sorted(documented - built)
    check(not missing, f"the Dockerfile's build runs {len(missing)} command(s) the tests' build does not, e.g.:\n"
                       + "\n".join(missing[:3]))
    result = subprocess.run(["ninja", "-C", test_build, "-t", "deps"], capture_output=True, text=True, timeout=120)
    check(result.returncode == 0, f"ninja -t deps in {test_build} failed: {result.stderr[-2000:]}")
    read = {os.path.realpath(os.path.join(test_build, line.strip())) for line in result.stdout.splitlines()
            if line.startswith("    ")}
    absent = sorted(path for path in read if path.startswith(SOURCE + "/")
                    and not os.path.exists(os.path.join(src, os.path.relpath(path, SOURCE))))
    check(not absent, f"the build reads files that `COPY . /src` leaves out (.dockerignore): {absent[:5]}")


# --- Manifests --------------------------------------------------------------------------

def scenario_manifests(binary):
    config_maps = {"trainer-config": find(load_yaml("config.yaml"), "ConfigMap")}
    config_text = config_maps["trainer-config"]["data"]["job.json"]
    count = config_node_count(config_maps)
    # The config in the ConfigMap is one bt-launch accepts.
    env = {name: value for name, value in os.environ.items() if not name.startswith(("BT_", "OMPI_", "SLURM_"))}
    env.update({"BT_JOB_CONFIG": config_text, "BT_NODE_RANK": "0", "BT_GROUP_SIZE": str(count), "BT_LEADER_ADDR": "x"})
    result = subprocess.run([binary, "env", "--format", "json", "--root", tempfile.gettempdir()], env=env,
                            capture_output=True, text=True, timeout=30)
    check(result.returncode == 0, f"bt-launch rejects the ConfigMap's job.json:\n{result.stderr}")

    documents = load_yaml("indexed-job.yaml")
    job, service = find(documents, "Job"), find(documents, "Service")
    spec = job["spec"]
    check(spec["completionMode"] == "Indexed", "the Job is not Indexed")
    check(spec["completions"] == spec["parallelism"] == count,
          f"completions {spec['completions']} / parallelism {spec['parallelism']} != compute.node_count {count}")
    check(service["spec"]["clusterIP"] == "None", "the Service is not headless")
    check(service["spec"].get("publishNotReadyAddresses") is True, "the leader must resolve before it is Ready")
    check(service["spec"]["selector"] == {"job-name": job["metadata"]["name"]}, "the Service does not select the Job's pods")
    ports = {port["port"] for port in service["spec"]["ports"]}
    check({29300, 29500} <= ports, f"the Service lacks the rendezvous or torch port: {ports}")
    container = spec["template"]["spec"]["containers"][0]
    leader = next(entry["value"] for entry in container["env"] if entry["name"] == "BT_LEADER_ADDR")
    check(leader == f"{job['metadata']['name']}-0.{service['metadata']['name']}", f"BT_LEADER_ADDR {leader} is not pod 0")
    check(container["command"][:2] == ["bt-launch", "run"], f"the container runs {container['command']}")

    lws = find(load_yaml("leaderworkerset.yaml"), "LeaderWorkerSet")
    check(lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1", f"LWS apiVersion {lws['apiVersion']}")
    check(lws["spec"]["leaderWorkerTemplate"]["size"] == count, "the LWS group size != compute.node_count")

    for example in ("slurm/job.json", "mpirun/job.json"):
        with open(os.path.join(EXAMPLES, example)) as stream:
            config = stream.read()
        env["BT_JOB_CONFIG"] = config
        result = subprocess.run([binary, "env", "--root", tempfile.gettempdir()], env=env, capture_output=True, text=True,
                                timeout=30)
        check(result.returncode == 0, f"bt-launch rejects examples/{example}:\n{result.stderr}")


SCENARIOS = {
    "kubernetes-indexed-job": scenario_kubernetes_indexed_job,
    "kubernetes-two-indexed-jobs": scenario_kubernetes_two_indexed_jobs,
    "kubernetes-lws": scenario_kubernetes_lws,
    "slurm": scenario_slurm,
    "mpirun": scenario_mpirun,
    "dockerfile": scenario_dockerfile,
    "manifests": scenario_manifests,
}


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in SCENARIOS:
        sys.exit(f"usage: orchestrators_test.py {'|'.join(SCENARIOS)} BT_LAUNCH")
    binary = os.path.realpath(sys.argv[2])
    try:
        SCENARIOS[sys.argv[1]](binary)
    except Failure as failure:
        print(f"FAIL: {failure}")
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
