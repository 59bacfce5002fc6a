"""Fashion-MNIST from Debian's dataset-fashion-mnist, and the CNN co2-train uses."""

from __future__ import annotations

import gzip
import os
from typing import Tuple

import numpy as np
import torch
from torch import nn

DATA_DIR = os.environ.get("CO2_FASHION_MNIST", "/usr/share/datasets/fashion-mnist")
# The training set's pixel mean and standard deviation (co2-train's too).
MEAN, STD = 0.2860, 0.3530


def _read_idx(path: str) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims))
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def load(split: str = "train") -> Tuple[torch.Tensor, torch.Tensor]:
    """Images (N, 1, 28, 28), normalised as co2-train does, and labels (N,)."""
    prefix = "train" if split == "train" else "t10k"
    images = _read_idx(os.path.join(DATA_DIR, f"{prefix}-images-idx3-ubyte.gz"))
    labels = _read_idx(os.path.join(DATA_DIR, f"{prefix}-labels-idx1-ubyte.gz"))
    x = torch.from_numpy((images.astype(np.float32) / 255.0 - MEAN) / STD).unsqueeze(1)
    y = torch.from_numpy(labels.astype(np.int64))
    return x, y


class Net(nn.Module):
    """conv 5×5 (16) → pool → conv 5×5 (32) → pool → 128 → 10: the layers of
    co2-train's Fashion-MNIST model, so both train the same parameter vector."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 5)
        self.conv2 = nn.Conv2d(16, 32, 5)
        self.fc1 = nn.Linear(32 * 4 * 4, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
        h = torch.max_pool2d(torch.relu(self.conv2(h)), 2)
        h = torch.relu(self.fc1(h.flatten(1)))
        return self.fc2(h)


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 1000) -> float:
    """Top-1 accuracy of `model` on (x, y)."""
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(x), batch):
            correct += (model(x[i:i + batch]).argmax(1) == y[i:i + batch]).sum().item()
    model.train()
    return correct / len(x)
