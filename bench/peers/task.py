"""The peers benchmark's task: a decoder-only transformer language model on
the bytes of Debian's fortunes (package `fortunes`, /usr/share/games/fortunes).

Every system trains exactly this: the same model at a seed (made under
``torch.manual_seed(seed)``), the same train/validation split (the last tenth
of every fortune file is validation), the same per-worker partition (worker w
of N reads the w-th contiguous Nth of the training bytes) and the same batch
order (a generator seeded with seed and w draws the batch offsets).
"""

from __future__ import annotations

import dataclasses
import glob
import math
import os

import torch
from torch import nn
from torch.nn import functional as F

CORPUS = "/usr/share/games/fortunes"


@dataclasses.dataclass(frozen=True)
class ModelSize:
    """A transformer shape and the batch one worker takes per step."""
    d_model: int
    layers: int
    heads: int
    context: int
    batch: int


SIZES = {
    # --quick: a seconds-per-run smoke configuration.
    "tiny": ModelSize(d_model=64, layers=2, heads=2, context=32, batch=4),
    # ~3.3M parameters: compute-bound on 2 cores.
    "small": ModelSize(d_model=256, layers=4, heads=4, context=64, batch=4),
    # ~25M parameters: bandwidth-bound at 100 Mbit/s.
    "medium": ModelSize(d_model=512, layers=8, heads=8, context=64, batch=4),
}


def corpus_files() -> list:
    """The fortune text files, sorted (not the .dat indexes, not the .u8 links)."""
    files = sorted(f for f in glob.glob(os.path.join(CORPUS, "*"))
                   if os.path.isfile(f) and not f.endswith((".dat", ".u8")))
    if not files:
        raise FileNotFoundError(f"no fortunes in {CORPUS}: apt-get install fortunes")
    return files


def load_split() -> tuple:
    """(train, validation) byte tensors (uint8): the last 10 % of each file
    is validation, the rest training, files in sorted order."""
    train, val = [], []
    for path in corpus_files():
        with open(path, "rb") as f:
            data = f.read()
        cut = len(data) - len(data) // 10
        train.append(data[:cut])
        val.append(data[cut:])
    as_tensor = lambda parts: torch.frombuffer(bytearray(b"".join(parts)), dtype=torch.uint8)
    return as_tensor(train), as_tensor(val)


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class ByteLM(nn.Module):
    """GPT-style byte LM: token and position embeddings, pre-norm blocks,
    a final LayerNorm and an untied head over 256 bytes."""

    def __init__(self, size: ModelSize) -> None:
        super().__init__()
        self.embed = nn.Embedding(256, size.d_model)
        self.pos = nn.Embedding(size.context, size.d_model)
        self.blocks = nn.ModuleList(Block(size.d_model, size.heads) for _ in range(size.layers))
        self.ln = nn.LayerNorm(size.d_model)
        self.head = nn.Linear(size.d_model, 256)
        nn.init.normal_(self.pos.weight, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) + self.pos.weight[: x.shape[1]]
        for block in self.blocks:
            h = block(h)
        return self.head(self.ln(h))


def fragments(model: ByteLM, k: int = 2) -> list:
    """k consecutive parts of the model for torchft's streaming DiLoCo,
    blocks split as evenly as they go: the embeddings go with the first
    blocks, the final LayerNorm and the head with the last (k = 2: the
    embeddings and the first half of the blocks; the rest and the head)."""
    n = len(model.blocks)
    if not 1 <= k <= n:
        raise ValueError(f"{k} fragments of a model of {n} blocks")
    cuts = [round(i * n / k) for i in range(k + 1)]
    parts = [list(model.blocks[cuts[i]:cuts[i + 1]]) for i in range(k)]
    parts[0] = [model.embed, model.pos] + parts[0]
    parts[-1] = parts[-1] + [model.ln, model.head]
    return [nn.ModuleList(p) for p in parts]


def make_model(size: ModelSize, seed: int) -> ByteLM:
    torch.manual_seed(seed)
    return ByteLM(size)


def loss_of(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """Next-byte cross entropy (nats) of a [B, T+1] batch of bytes."""
    logits = model(batch[:, :-1])
    return F.cross_entropy(logits.reshape(-1, 256), batch[:, 1:].reshape(-1))


class Batches:
    """Worker ``worker``'s batches: random windows of its contiguous
    partition of the training bytes, drawn by a generator seeded with
    (seed, worker), so step s is the same batch for every system."""

    def __init__(self, train: torch.Tensor, size: ModelSize, seed: int, worker: int,
                 workers: int) -> None:
        part = len(train) // workers
        self.data = train[worker * part:(worker + 1) * part].long()
        self.size = size
        self.gen = torch.Generator().manual_seed(seed * 1000 + worker)

    def next(self) -> torch.Tensor:
        t = self.size.context + 1
        starts = torch.randint(0, len(self.data) - t, (self.size.batch,), generator=self.gen)
        return torch.stack([self.data[s:s + t] for s in starts.tolist()])


def validation_batches(val: torch.Tensor, size: ModelSize, windows: int) -> torch.Tensor:
    """``windows`` fixed, evenly spaced windows of the validation bytes;
    0: the whole split, in consecutive windows."""
    t = size.context + 1
    if windows == 0:
        windows = len(val) // t
    stride = (len(val) - t) // windows
    return torch.stack([val[i * stride:i * stride + t] for i in range(windows)]).long()


@torch.no_grad()
def evaluate(model: nn.Module, windows: torch.Tensor, chunk: int = 64) -> float:
    was = model.training
    model.eval()
    total = sum(loss_of(model, windows[i:i + chunk]).item() * len(windows[i:i + chunk])
                for i in range(0, len(windows), chunk))
    model.train(was)
    loss = total / len(windows)
    if not math.isfinite(loss):
        raise FloatingPointError(f"validation loss is {loss}")
    return loss


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
