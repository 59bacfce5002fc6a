"""Fingerprints of a model's parameter bytes: equal digests, equal bits."""

import hashlib

import torch


def params_digest(model: torch.nn.Module) -> str:
    """The SHA-256 of the parameters' bytes, in parameter order."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def params_fnv1a(model: torch.nn.Module) -> str:
    """co2's FNV-1a of the parameters' bytes (common/fnv_hash.h, from its
    offset 1469598103934665603), as 16 hex digits: the hash co2-train reports
    as final_hash and co2-checkpoint prints as anchor_fnv1a."""
    h = 1469598103934665603
    for p in model.parameters():
        for b in p.detach().cpu().contiguous().numpy().tobytes():
            h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"
