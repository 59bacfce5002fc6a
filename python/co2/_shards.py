"""ShardMirror: a model sharded by FSDP2 (``fully_shard``) as co2's vector.

Each parameter is a DTensor sharded on dim 0 over the node's L ranks; rank
k holds its ``to_local()`` shards. co2's vector is, rank by rank, each
rank's local shards in parameter order, padded with zeros to the end of the
rank's slice, so that rank k's slice is its FSDP2 shard and no collective
inside the node moves parameters. The slices are whole service shards: with
S = L·s shards and Q = ⌈max_k n_k / (s·B)⌉·s·B elements per rank (B the
65,536-element block, n_k rank k's local elements), P = L·Q gives every
shard Q/s elements, so rank k's slice common::RankRange(P, S, L, k) is
[k·Q, (k+1)·Q). The padding stays zero: its Δ is always 0.

The mirror is a float32 CPU buffer of Q elements, which the C++ exchange
reads Δ from and writes the anchor into: a gather copies the local shards
into it (widening them), a scatter copies it back in place.
"""

from __future__ import annotations

from typing import Iterator, List, Optional, Sequence, Tuple

import torch

from . import _core
from ._node import Node

# Elements of one block of the service's layout (256 KiB of float32).
BLOCK = 65536


def dtensor_type() -> Optional[type]:
    """torch's DTensor class, or None where torch has none (before 2.5)."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        return None
    return DTensor


def is_sharded(params: Sequence[torch.Tensor]) -> bool:
    """Whether ``params`` are DTensors (a model under FSDP2); ValueError
    when only some are."""
    dtensor = dtensor_type()
    if dtensor is None:
        return False
    kinds = [isinstance(p, dtensor) for p in params]
    if any(kinds) and not all(kinds):
        first = kinds.index(not kinds[0])
        raise ValueError(
            f"parameter {first} is {'a DTensor' if kinds[first] else 'a plain tensor'}, "
            f"parameter 0 is not: pass a model whose parameters are all sharded by "
            f"fully_shard, or none")
    return all(kinds)


class ShardMirror:
    """This rank's FSDP2 shards of ``params`` as its slice of co2's vector
    over ``num_shards`` shards (a multiple of the node's ranks)."""

    def __init__(self, params: List[torch.Tensor], node: Optional[Node],
                 num_shards: int) -> None:
        ranks = node.size if node is not None else 1
        rank = node.rank if node is not None else 0
        if num_shards % ranks != 0:
            raise ValueError(
                f"an FSDP2 model needs a multiple of its L={ranks} local ranks as shards "
                f"(each rank's slice is its FSDP2 shard, whole service shards), got "
                f"S={num_shards} shard addresses")
        self._params = params
        self.local_numel = sum(p.to_local().numel() for p in params)
        widest = (max(n for (n,) in node.gather_ints([self.local_numel]))
                  if node is not None else self.local_numel)
        step = (num_shards // ranks) * BLOCK
        per_rank = max(1, -(-widest // step)) * step
        self.numel = ranks * per_rank
        self.slices: List[Tuple[int, int]] = [
            tuple(_core.rank_range(self.numel, num_shards, ranks, k)) for k in range(ranks)]
        expected = (rank * per_rank, (rank + 1) * per_rank)
        if self.slices[rank] != expected:
            raise AssertionError(f"rank {rank}'s slice {self.slices[rank]} is not its "
                                 f"padded shard {expected}")
        self.slice = expected
        self.buffer = torch.zeros(per_rank, dtype=torch.float32)
        self.address = self.buffer.data_ptr()

    def view(self, begin: int, end: int) -> torch.Tensor:
        """The mirror, which is this rank's slice [begin, end) and no other."""
        if (begin, end) != self.slice:
            raise ValueError(f"this rank mirrors [{self.slice[0]}, {self.slice[1]}), "
                             f"not [{begin}, {end})")
        return self.buffer

    def mirror_bytes(self) -> int:
        return self.buffer.numel() * 4

    def local(self) -> torch.Tensor:
        """The local shards, flat, without the padding (a view)."""
        return self.buffer[:self.local_numel]

    def _pairs(self) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        """(a local shard, its part of the mirror), in parameter order."""
        offset = 0
        for p in self._params:
            t = p.to_local()
            yield t, self.buffer[offset:offset + t.numel()]
            offset += t.numel()

    def gather(self) -> None:
        """mirror ← the local shards."""
        for t, part in self._pairs():
            part.copy_(t.detach().reshape(-1))

    def scatter(self) -> None:
        """The local shards ← mirror, in place (rounded to their dtype)."""
        with torch.no_grad():
            for t, part in self._pairs():
                t.copy_(part.view(t.shape))
