"""co2.Optimizer's checkpoints: what ``state_dict()`` saves and how
``load_state_dict()`` resumes from it (the rest of the class is in
_optimizer.py)."""

from __future__ import annotations

from typing import Any, Dict

import torch
import torch.distributed as dist

from . import _core
from ._errors import Error


def _inner_state(inner: torch.optim.Optimizer) -> Dict[str, Any]:
    """The inner optimizer's state_dict; a ZeroRedundancyOptimizer's is
    consolidated onto every rank of its group first (one gather per rank),
    so that each rank's saved state resumes on its own."""
    try:
        from torch.distributed.optim import ZeroRedundancyOptimizer
    except ImportError:
        ZeroRedundancyOptimizer = ()  # type: ignore[assignment,misc]
    if not isinstance(inner, ZeroRedundancyOptimizer):
        return inner.state_dict()
    state: Dict[str, Any] = {}
    group = inner.process_group
    for to in range(dist.get_world_size(group)):
        inner.consolidate_state_dict(to=to)  # a rank of its group
        if to == dist.get_rank(group):
            state = inner.state_dict()
    return state


class CheckpointMixin:
    """state_dict and load_state_dict of co2.Optimizer."""

    def state_dict(self) -> Dict[str, Any]:
        """What this worker needs to resume after preemption: the inner
        optimizer's state, the round, the anchor the round starts from, a
        lossy uplink codec's error-feedback residual, and with eager updates
        or carried progress the round's start offset (eager updates: and
        their last Δ).

        Call it at a round boundary (after the step that ended a round).
        With co2, local rank 0 first waits for the update of the round it
        pushed last, so that every worker's contribution to that round is in
        and this worker may stop. Save it with the model's state as for any
        optimizer; ``load_state_dict`` in a new process continues from it.

        After ``finish()`` or ``leave()`` it is the final state: the inner
        optimizer's, the rounds done and the final anchor (the parameters,
        on local rank 0, and on every rank with ``rank_slices``), with
        ``"finished": True``; there is no round left to resume from it.

        With ``rank_slices`` each rank saves its own: its slice of the
        anchor (and of the residual and start offset), with ``"slice"``
        (its elements of the model), ``"local_ranks"`` (L) and
        ``"num_shards"`` (S); it resumes only with the same L and S. Every
        rank calls it at the same step.
        """
        if self._finished:
            return self._final_state()
        self._check_usable("state_dict")
        self.connect()
        if self._steps_in_round != 0:
            raise Error("FAILED_PRECONDITION",
                        f"state_dict in the middle of round {self._round} "
                        f"({self._steps_in_round} of {self.tau} steps): call it after the step "
                        f"that ends a round (every {self.tau} steps)")
        anchor = None
        if self._exchange is not None:
            owed = _core.owed_update(self._staleness, self.rounds, self._round)
            if owed is not None:
                try:
                    if self.rank_slices:
                        times = self._node.call("awaiting the update",
                                                lambda: self._exchange.await_update(owed))
                    else:
                        times = self._exchange.await_update(owed)
                except BaseException:
                    self._broken = True
                    raise
                self._exposed_comm += times["exposed_comm_s"]
            n = self._slice[1] - self._slice[0]
            anchor = torch.empty(n, dtype=torch.float32)
            self._exchange.copy_anchor(anchor.data_ptr(), anchor.numel())
            residual = torch.empty(n, dtype=torch.float32)
            if self._exchange.copy_residual(residual.data_ptr(), residual.numel()) == 0:
                residual = None  # a fp32 uplink keeps none
            offset = torch.empty(n, dtype=torch.float32)
            # Carried progress keeps no last Δ.
            last = (None if self.carry_progress
                    else torch.empty(n, dtype=torch.float32))
            filled = self._exchange.copy_start_offset(
                offset.data_ptr(), 0 if last is None else last.data_ptr(), n)
            # 0: eager updates and carried progress are off; 1: no last Δ.
            start = None if filled == 0 else (offset, last if filled == 2 else None)
        else:
            residual = start = None
        return {
            "inner": _inner_state(self._inner),
            "co2": {"round": self._round, "steps": self._steps, "tau": self.tau,
                    "rounds": self.rounds, "algo": self.algo, "anchor": anchor,
                    "residual": residual, "start_offset": start, "finished": False,
                    **self._layout()},
        }

    def _final_state(self) -> Dict[str, Any]:
        return {
            "inner": _inner_state(self._inner),
            "co2": {"round": self._round, "steps": self._steps, "tau": self.tau,
                    "rounds": self.rounds, "algo": self.algo, "anchor": self.anchor(),
                    "residual": None, "start_offset": None, "finished": True,
                    **self._layout()},
        }

    def _layout(self) -> Dict[str, Any]:
        """How the node split the exchange: what a saved state fits."""
        return {"rank_slices": self.rank_slices, "local_ranks": self._group_size,
                "num_shards": len(self._join["addresses"]),
                "slice": tuple(self._slice) if self.rank_slices else None}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Resumes from ``state_dict()``: call it before the first step.

        The inner optimizer's state is restored; the first step joins the job
        at the saved round with the saved anchor (the shards must still hold
        the job: a running service, or one restarted with --checkpoint_dir),
        so a job whose workers all stopped there and resumed ends bit for bit
        as if it had never stopped.
        """
        if self._connected:
            raise Error("FAILED_PRECONDITION",
                        "load_state_dict after the optimizer joined the job: call it "
                        "before the first step")
        saved = state["co2"]
        if saved.get("finished"):
            raise ValueError(f"the state was saved after finish() or leave(), at round "
                             f"{saved['round']}: that worker's part of the job is over and "
                             f"there is no round to resume")
        for key, mine in (("tau", self.tau), ("rounds", self.rounds), ("algo", self.algo)):
            if saved[key] != mine:
                raise ValueError(f"the state was saved with {key}={saved[key]!r}, "
                                 f"this optimizer has {key}={mine!r}")
        if saved.get("rank_slices", False) or self.rank_slices:
            # A rank's state holds its slice: it fits only the same split.
            mine = self._layout()
            for key in ("local_ranks", "num_shards", "rank_slices", "slice"):
                if saved.get(key) != mine[key]:
                    raise ValueError(
                        f"the state was saved with {key}={saved.get(key)!r}, this optimizer "
                        f"has {key}={mine[key]!r}: with rank_slices each rank saves its slice "
                        f"of the anchor, which resumes only with the same local ranks (L) "
                        f"and shards (S)")
        if self._exchanges:
            anchor = saved["anchor"]
            if anchor is None or anchor.numel() != self._slice[1] - self._slice[0]:
                raise ValueError("the state holds no anchor for this model: save it on "
                                 "local rank 0 and load it there")
        self._inner.load_state_dict(state["inner"])
        self._steps = saved["steps"]
        self._resume = saved
