#!/usr/bin/env python3
"""Data-parallel training on CPU (gloo), started by torchrun from bt-launch's environment.

Inputs, all from what bt-launch prepared before the first command:
  BASE_MODEL                 the weights[] mount: the base model the job starts from
  BT_PROJECT_CACHE_DIR       the dataset the cache seed wrote (demo-dataset/data.pt)
  BT_LOAD_CHECKPOINT_DIR     when a checkpoint was loaded: rank-<node>/checkpoint-<step>/,
                             the job resumes from its step
  DEMO_FAIL_ONCE             "<node>:<step>": in the first cycle (BT_RESTART_COUNT 0 or
                             unset), that node's first worker dies at that step, as a lost
                             GPU would end it (restart.json shows the restart in place)
  DEMO_HANG_ONCE             "<node>:<step>": in the first cycle, that node's second worker
                             stops before the step's all_reduce and never returns, while
                             the other ranks wait in it (bt-launch's watchdog finds it);
                             "<node>:<step>:every" does it in every cycle
Output: checkpoints in the Hugging Face Trainer layout under BT_CHECKPOINT_DIR, written by
each node's first worker (Trainer's save_on_each_node: the directory is node-local):
checkpoint-<step>/ with pytorch_model.bin, optimizer.pt, rng_state_<rank>.pth and
trainer_state.json last; older ones rotated away beyond SAVE_TOTAL_LIMIT.
"""
import gc
import json
import os
import shutil
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from model import build_model

STATE_FILE = "trainer_state.json"


def setting(name, default):
    return int(os.environ.get(name, default))


def checkpoint_step(name):
    prefix = "checkpoint-"
    return int(name[len(prefix):]) if name.startswith(prefix) and name[len(prefix):].isdigit() else None


def loaded_checkpoint():
    """The newest checkpoint bt-launch loaded for this node, or None for a fresh start."""
    root = os.environ.get("BT_LOAD_CHECKPOINT_DIR")
    if not root:
        return None
    part = os.path.join(root, f"rank-{os.environ['BT_NODE_RANK']}")
    names = [name for name in os.listdir(part) if checkpoint_step(name) is not None] if os.path.isdir(part) else []
    return os.path.join(part, max(names, key=checkpoint_step)) if names else None


def save_checkpoint(model, optimizer, step, history, limit):
    directory = os.environ["BT_CHECKPOINT_DIR"]
    path = os.path.join(directory, f"checkpoint-{step}")
    os.makedirs(path, exist_ok=True)
    torch.save(model.module.state_dict(), os.path.join(path, "pytorch_model.bin"))
    torch.save(optimizer.state_dict(), os.path.join(path, "optimizer.pt"))
    torch.save({"cpu": torch.get_rng_state()}, os.path.join(path, f"rng_state_{dist.get_rank()}.pth"))
    with open(os.path.join(path, STATE_FILE), "w") as state:  # last: it marks the checkpoint complete
        json.dump({"global_step": step, "log_history": history}, state)
    # Trainer's rotation: after a save, only the newest `limit` checkpoints stay.
    saved = sorted((name for name in os.listdir(directory) if checkpoint_step(name) is not None), key=checkpoint_step)
    for name in saved[:-limit]:
        shutil.rmtree(os.path.join(directory, name))
    return path


def once_here(variable, local_rank, step):
    """Whether `variable` ("<node>:<step>") names this worker and this step in the job's first cycle."""
    spec = os.environ.get(variable)
    if not spec or os.environ["LOCAL_RANK"] != local_rank:
        return False
    node, at_step, *every = spec.split(":")
    if every != ["every"] and os.environ.get("BT_RESTART_COUNT", "0") != "0":
        return False
    return int(node) == int(os.environ["BT_NODE_RANK"]) and step == int(at_step)


def sleep_forever():
    """A straggler that never comes back: the one rank not in all_reduce."""
    while True:
        time.sleep(3600)


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    first_on_node = int(os.environ["LOCAL_RANK"]) == 0
    node = os.environ["BT_NODE_RANK"]
    steps, save_steps, limit = setting("TRAIN_STEPS", 60), setting("SAVE_STEPS", 20), setting("SAVE_TOTAL_LIMIT", 2)

    torch.manual_seed(0)
    model = build_model()
    model.load_state_dict(torch.load(os.path.join(os.environ["BASE_MODEL"], "pytorch_model.bin")))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    start, history = 0, []
    resume = loaded_checkpoint()
    if resume:
        model.load_state_dict(torch.load(os.path.join(resume, "pytorch_model.bin")))
        optimizer.load_state_dict(torch.load(os.path.join(resume, "optimizer.pt")))
        with open(os.path.join(resume, STATE_FILE)) as state:
            saved = json.load(state)
        start, history = saved["global_step"], saved["log_history"]
        if rank == 0:
            print(f"train: resumed from {resume} at step {start} (loss then {history[-1]['loss']:.4f})", flush=True)
    model = DistributedDataParallel(model)

    data = torch.load(os.path.join(os.environ["BT_PROJECT_CACHE_DIR"], "demo-dataset", "data.pt"))
    dataset = TensorDataset(data["inputs"], data["targets"])
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, seed=0)
    loader = DataLoader(dataset, batch_size=64, sampler=sampler)
    if rank == 0:
        print(f"train: {world} workers on {os.environ['NNODES']} nodes, steps {start + 1}..{steps}, "
              f"{len(dataset)} samples from the project cache", flush=True)

    step, epoch, started = start, 0, time.monotonic()
    batches = iter(())
    while step < steps:
        try:
            inputs, targets = next(batches)
        except StopIteration:
            sampler.set_epoch(epoch)
            epoch += 1
            batches = iter(loader)
            continue
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if once_here("DEMO_FAIL_ONCE", "0", step):
            print(f"train: node {node} fails at step {step} (DEMO_FAIL_ONCE)", flush=True)
            os._exit(3)
        if once_here("DEMO_HANG_ONCE", "1", step):
            print(f"train: rank {rank} on node {node} hangs at step {step} (DEMO_HANG_ONCE)", flush=True)
            sleep_forever()
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        mean_loss = mean_loss.item() / world
        if step % 10 == 0 or step == steps:
            history.append({"step": step, "loss": round(mean_loss, 6)})  # the same on every rank
            if rank == 0:
                print(f"train: step {step}/{steps} loss {mean_loss:.4f}", flush=True)
        if step % save_steps == 0 or step == steps:
            if first_on_node:
                path = save_checkpoint(model, optimizer, step, history, limit)
                print(f"train: node {node} saved {os.path.basename(path)}", flush=True)
            dist.barrier()
    if rank == 0:
        print(f"train: done at step {step} in {time.monotonic() - started:.1f} s", flush=True)
    # The DDP model goes first: if its Reducer held the last reference to the process group,
    # the group's destructor would join gloo's threads with the GIL held while one of them
    # waits for the GIL to free a tensor, a deadlock at exit (pytorch/pytorch#56297).
    del model
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
