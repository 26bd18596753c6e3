#!/usr/bin/env python3
"""Writes the demo's inputs, each atomically (a hidden sibling, then a rename):

  prepare.py base-model DIR   the "pretrained" model a weights[] entry stages (file:// source)
  prepare.py dataset DIR      the training set, written into the project cache by the cache seed
"""
import json
import os
import shutil
import sys

import torch

from model import FEATURES, build_model

SAMPLES = 8192


def publish(directory, write):
    staging = os.path.join(os.path.dirname(os.path.abspath(directory)), "." + os.path.basename(directory) + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
    write(staging)
    shutil.rmtree(directory, ignore_errors=True)
    os.rename(staging, directory)


def write_base_model(directory):
    torch.manual_seed(1234)
    torch.save(build_model().state_dict(), os.path.join(directory, "pytorch_model.bin"))
    with open(os.path.join(directory, "config.json"), "w") as config:
        json.dump({"architecture": "mlp", "features": FEATURES, "hidden": 64}, config)


def write_dataset(directory):
    generator = torch.Generator().manual_seed(7)
    inputs = torch.randn(SAMPLES, FEATURES, generator=generator)
    weights = torch.randn(FEATURES, 1, generator=generator)
    targets = 2 * torch.tanh(inputs @ weights / 4) + 0.05 * torch.randn(SAMPLES, 1, generator=generator)
    torch.save({"inputs": inputs, "targets": targets}, os.path.join(directory, "data.pt"))


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("base-model", "dataset"):
        sys.exit("usage: prepare.py base-model|dataset DIR")
    what, directory = sys.argv[1], sys.argv[2]
    publish(directory, write_base_model if what == "base-model" else write_dataset)
    print(f"prepare.py: wrote the {what} to {directory}")


if __name__ == "__main__":
    main()
