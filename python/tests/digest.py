"""The SHA-256 of a model's parameter bytes: equal digests, equal bits."""

import hashlib

import torch


def params_digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()
