"""Node: the local ranks of one worker (a torch.distributed group) and the
collectives by which co2.Optimizer's ranks agree when each exchanges its own
slice of the model with the shards (docs/python.md, "Rank slices").

Every method is a collective: each rank of the group calls it at the same
point, in the same order. The all-gathers are per-rank broadcasts, which
every Gloo has (torch 1.13's lacks ``_allgather_base``) and which carry
slices of unequal sizes.
"""

from __future__ import annotations

from typing import Any, Callable, List, Sequence, Tuple, TypeVar

import torch
import torch.distributed as dist

from ._errors import Error

T = TypeVar("T")

# How often the ranks that are behind rejoin before the node gives up on one
# round: each rejoin fetches the shards' current anchor, so one suffices
# unless the job moves on meanwhile.
AGREE_TRIES = 5


class Node:
    """The ranks of ``group`` (this process among them), with tensors for
    the small agreements on ``device`` (the parameters', so that NCCL groups
    work too)."""

    def __init__(self, group: Any, device: torch.device) -> None:
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.global_ranks = [dist.get_global_rank(group, k) for k in range(self.size)]
        self.device = device

    def gather_ints(self, values: Sequence[int]) -> List[List[int]]:
        """Every rank's ``values`` (the same length on each), by rank."""
        table = torch.zeros(self.size, len(values), dtype=torch.int64, device=self.device)
        table[self.rank] = torch.tensor(list(values), dtype=torch.int64)
        for k in range(self.size):
            dist.broadcast(table[k], src=self.global_ranks[k], group=self.group)
        return table.tolist()

    def from_leader(self, value: int) -> int:
        """Local rank 0's ``value``, on every rank."""
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.broadcast(t, src=self.global_ranks[0], group=self.group)
        return int(t.item())

    def broadcast_from_leader(self, tensor: torch.Tensor) -> None:
        """tensor ← local rank 0's, in place."""
        dist.broadcast(tensor, src=self.global_ranks[0], group=self.group)

    def share_slices(self, flat: torch.Tensor, slices: Sequence[Tuple[int, int]]) -> None:
        """flat[b:e] ← rank k's, for rank k's slice (b, e): afterwards every
        rank holds each rank's slice, the whole of ``flat``."""
        for k, (begin, end) in enumerate(slices):
            if end > begin:
                dist.broadcast(flat[begin:end], src=self.global_ranks[k], group=self.group)

    def call(self, what: str, fn: Callable[[], T]) -> T:
        """Runs ``fn`` on every rank; a failure on any rank fails all: the
        rank that failed raises its own error, the others a co2.Error naming
        it, so that no rank goes on alone (and waits for the others in its
        next collective)."""
        error: BaseException | None = None
        result: Any = None
        try:
            result = fn()
        except Exception as e:  # KeyboardInterrupt ends the process as it is
            error = e
        failed = [k for k, (f,) in enumerate(self.gather_ints([error is not None])) if f]
        if error is not None:
            raise error
        if failed:
            raise Error("ABORTED", f"{what} failed on local rank {failed[0]} of this node"
                                   f"{' (and ' + str(failed[1:]) + ')' if failed[1:] else ''}; "
                                   f"that rank's error says why")
        return result

    def agree_round(self, mine: int, rejoin: Callable[[], int], what: str) -> int:
        """The one round every rank continues at: while the ranks' rounds
        differ, those behind the latest ``rejoin()`` (heal, fetching their
        shards' anchor; it returns the round they continue at). A co2.Error
        (ABORTED) naming the rounds when they differ after AGREE_TRIES
        rejoins: the node never goes on with ranks at several rounds."""
        rounds: List[int] = []
        for attempt in range(AGREE_TRIES + 1):
            rounds = [r for (r,) in self.gather_ints([mine])]
            if min(rounds) == max(rounds):
                return mine
            if attempt == AGREE_TRIES:
                break
            behind = mine < max(rounds)
            mine = self.call(f"rejoining {what}", rejoin if behind else (lambda: mine))
        raise Error("ABORTED",
                    f"the {self.size} local ranks of this node could not agree on one round "
                    f"{what} after {AGREE_TRIES} rejoins: they are at rounds {rounds} "
                    f"(local rank k at rounds[k])")
