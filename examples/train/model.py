"""The demo's model: small enough to train on CPU in seconds."""
import torch

FEATURES = 16


def build_model():
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
