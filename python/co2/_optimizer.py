"""co2.Optimizer: wraps any torch.optim optimizer into a worker of a co2 job."""

from __future__ import annotations

import os
import socket
import time
import warnings
from typing import Any, Dict, Iterable, List, Optional, Sequence

import torch
import torch.distributed as dist

from . import _core
from ._checkpoint import CheckpointMixin
from ._config import JobConfig
from ._errors import Error
from ._host_tcp import check_host_tcp
from ._node import Node
from ._params import DTYPES, HostParams
from ._shards import ShardMirror, is_sharded


# The largest bucket of gradients the node averages in one all-reduce
# (DDP's default bucket_cap_mb).
GRAD_BUCKET_BYTES = 25 * 2**20


def _param_list(params: Iterable[Any]) -> List[torch.Tensor]:
    out: List[torch.Tensor] = []
    for p in params:
        if isinstance(p, dict):  # a param group
            out.extend(p["params"])
        else:
            out.append(p)
    if not out:
        raise ValueError("co2.Optimizer got no parameters")
    for i, p in enumerate(out):
        if not isinstance(p, torch.Tensor):
            raise ValueError(f"parameter {i} is a {type(p).__name__}, not a tensor")
        if p.dtype not in DTYPES:
            raise ValueError(f"parameter {i} is {p.dtype}; co2 trains float32, bfloat16 or "
                             f"float16 parameters")
    seen: Dict[int, int] = {}
    for i, p in enumerate(out):
        if id(p) in seen:
            raise ValueError(f"parameter {i} is parameter {seen[id(p)]} again; pass each once")
        seen[id(p)] = i
    devices = {p.device for p in out}
    if len(devices) > 1:
        raise ValueError(f"parameters live on several devices: {sorted(map(str, devices))}")
    dtypes = {p.dtype for p in out}
    if len(dtypes) > 1:
        raise ValueError(f"parameters have several dtypes: {sorted(map(str, dtypes))}; co2 keeps "
                         f"them in one flat tensor: give the model one dtype (model.float(), "
                         f"model.bfloat16()), or keep it float32 and train under torch.autocast")
    return out


def _check_inner(inner: torch.optim.Optimizer) -> None:
    """ValueError for an inner optimizer co2 cannot drive."""
    try:
        from torch.distributed.optim import ZeroRedundancyOptimizer
    except ImportError:
        return
    if isinstance(inner, ZeroRedundancyOptimizer) and inner.parameters_as_bucket_view:
        raise ValueError(
            "ZeroRedundancyOptimizer(parameters_as_bucket_view=True) rebinds the parameters "
            "to its own buckets, and co2 keeps them in one flat tensor: make it with "
            "parameters_as_bucket_view=False")


def _default_worker_id() -> str:
    group = os.environ.get("GROUP_RANK")
    if group is not None:
        return f"worker-{group}"
    return f"{socket.gethostname()}-{os.getpid()}"


class Optimizer(CheckpointMixin, torch.optim.Optimizer):
    """Trains a model as one worker of a co2 job (docs/python.md).

    Every ``step()`` runs the inner optimizer (after averaging the gradients
    over ``process_group``, the ranks of this node, when there are several);
    every ``tau``-th step ends a round: the node's local rank 0 sends
    Δ = A − x to the aggregator shards and sets the parameters to the next
    anchor A, which it broadcasts to the node. With ``algo="co2"`` the
    average of a round arrives while the next one computes (one round stale),
    so the network is waited for only when it is slower than a round.

    It is a ``torch.optim.Optimizer`` over the inner optimizer's
    ``param_groups`` and ``state``, so learning-rate schedulers and
    ``GradScaler`` take it as they take the inner one.

    Args:
        params: the model's parameters (all float32, or all bfloat16 or
            float16, on one device, each once), the same the inner optimizer
            updates. They become views of one flat tensor, which the
            exchange works on in place. The anchor on the shards is float32;
            bfloat16 or float16 parameters are set to it rounded. The
            parameters of a model sharded by FSDP2 (``fully_shard``: all
            DTensors) stay as they are: each rank exchanges its own shards
            (docs/sharding.md).
        inner: any ``torch.optim`` optimizer over ``params`` (a
            ``ZeroRedundancyOptimizer`` with
            ``parameters_as_bucket_view=False`` too).
        tau: inner steps per round.
        aggregators: ``host:port`` of every shard, in shard order.
        job: the job's name, the same on every worker.
        rounds: the job's number of rounds (its inner steps / tau, rounded
            up: ``math.ceil(epochs * len(loader) / tau)``), the same on every
            worker. Required for co2, whose last update arrives after the
            last round, so the shards must know which round that is.
        config: the job's outer-step settings (``co2.JobConfig``); the
            fields the optimizer knows are filled in.
        algo: ``"co2"``, ``"localsgd"``, ``"slowmo"`` or ``"diloco"``
            (synchronous, Nesterov outer momentum; without ``config``, its
            published α = 0.7 and β = 0.9).
        worker_id: unique per worker (default ``worker-$GROUP_RANK`` under
            torchrun, else host and pid).
        uplink_codec: Δ's encoding, ``"fp32"``, ``"bf16"`` or ``"int8"``
            (lossy codecs keep an error-feedback residual).
        samples_per_step: samples one inner step of this worker consumes (all
            its ranks); a contribution weighs steps × samples_per_step.
        ca_file, cert_file, key_file: TLS to the shards (CA to verify them;
            certificate and key for mTLS). Empty: plaintext.
        token_file: a file holding the job's bearer token (needs TLS).
        process_group: the ranks of this node (``torch.distributed``), or
            None: the default group when one is initialised and spans one
            node, else this process alone.
        average_gradients: average the gradients over ``process_group`` in
            every step, in buckets of at most 25 MiB (False when the model
            is wrapped in DDP already; ignored under FSDP2, which averages
            them itself).
        rejoin: this worker restarted into a job it was a member of.
        connect_timeout: seconds to join every shard.
        update_timeout: seconds one update may be waited for.
        verify_final_anchor: ``finish()`` checks the final anchor against the
            shards' bit for bit.
        eager_share: co2 only: eager updates (docs/algorithm.md, "Outer
            momentum under a one-round-stale average") with this worker's
            share of a round's mean, 1/M for M workers of equal weight; each
            round then starts from the anchor plus the eager update of this
            worker's own latest Δ. 0 (the default): off.
        carry_progress: co2 only, not with ``eager_share``: until the
            update made from a round's mean is applied, the next round runs
            from where this worker's own Δ of that round would take the
            anchor, instead of from the anchor, which lacks every worker's
            last round (docs/algorithm.md, "Carried progress"). None (the
            default): on for co2 without ``eager_share``, with the default
            outer step α = 1 (the plain average), else off;
            ``opt.carry_progress`` says which.
        apply: co2 only: when the update a round owes is applied.
            ``"arrival"``: after the inner step it has arrived by (local
            rank 0 tests for it after every step and, with several ranks,
            broadcasts its decision), keeping the steps taken since the
            round's start; at the boundary when it is later
            (docs/algorithm.md, "Applying an update when it arrives").
            ``"boundary"``: at the end of the round it arrives in, a whole
            round after its Δ was sent; what a deterministic job needs. None
            (the default): arrival for co2 unless ``config.deterministic``,
            else boundary.
        apply_by_step: with ``apply="arrival"``: the inner step of a round
            by which the owed update is applied at the latest; local rank 0
            waits for it there if it has not arrived, as the boundary would
            (docs/algorithm.md). 0 (the default): only the boundary waits.
            At most ``tau - 1``.
        link_mbit, link_rtt: the rate (Mbit/s) and round trip (seconds) of
            this node's path to the shards; where either is given, local
            rank 0 checks at ``connect()`` whether the host's TCP settings
            let one stream fill it (``co2.check_host_tcp``: a
            ``co2.HostTcpWarning`` where they do not). 0: not said.
        rank_slices: with L > 1 ranks in ``process_group``: each local rank
            exchanges its own slice of the model with the shards it owns
            (docs/python.md, "Rank slices"), under this worker's one
            ``worker_id``, and the ranks share their slices after every
            exchange, so each holds the whole model; co2's state per rank is
            then 1/L of the leader-only one. Needs at least L shard
            addresses. None (the default): on where there are at least L
            shards, else local rank 0 alone exchanges (said once in a
            warning); False: local rank 0 alone exchanges the whole model;
            True: ValueError where there are fewer than L shards.

    Raises:
        ValueError: a bad argument or config value, naming it.
        co2.Error: the shards refused the worker or could not be reached.
    """

    def __init__(
        self,
        params: Iterable[Any],
        inner: torch.optim.Optimizer,
        *,
        tau: int,
        aggregators: Sequence[str],
        job: str,
        rounds: int = 0,
        config: Optional[JobConfig] = None,
        algo: str = "co2",
        worker_id: Optional[str] = None,
        uplink_codec: str = "fp32",
        samples_per_step: float = 1.0,
        ca_file: str = "",
        cert_file: str = "",
        key_file: str = "",
        token_file: str = "",
        process_group: Optional[Any] = None,
        average_gradients: bool = True,
        rejoin: bool = False,
        connect_timeout: float = 60.0,
        update_timeout: float = 300.0,
        verify_final_anchor: bool = True,
        eager_share: float = 0.0,
        carry_progress: Optional[bool] = None,
        apply: Optional[str] = None,
        apply_by_step: int = 0,
        link_mbit: float = 0.0,
        link_rtt: float = 0.0,
        rank_slices: Optional[bool] = None,
    ) -> None:
        # ValueError for an algorithm the C++ side does not run with shards.
        outer_defaults = _core.outer_defaults(algo)
        if not isinstance(tau, int) or tau < 1:
            raise ValueError(f"tau must be an int >= 1, got {tau!r}")
        if not isinstance(rounds, int) or rounds < 0:
            raise ValueError(f"rounds must be an int >= 0, got {rounds!r}")
        if algo == "co2" and rounds == 0:
            raise ValueError(
                "co2 needs rounds=: the job's number of rounds, the same on every worker, "
                f"math.ceil(inner steps of the whole job / tau={tau}), e.g. "
                "rounds=math.ceil(epochs * len(loader) / tau); the update of the last round "
                "arrives after it, so the shards must know which round ends the job")
        if not aggregators:
            raise ValueError("aggregators is empty: give host:port of every shard")
        if not job:
            raise ValueError("job is empty")
        # Where carried progress applies at all (client::DefaultCarryProgress).
        carries = _core.default_carry_progress(algo, eager_share != 0)
        self.carry_progress = carries if carry_progress is None else bool(carry_progress)
        if self.carry_progress and not carries:
            raise ValueError(
                "carry_progress=True is for algo='co2' without eager_share (both move where "
                f"a round starts), got algo={algo!r}, eager_share={eager_share!r}")
        deterministic = bool(config is not None and config.deterministic)
        if apply is None:
            apply = _core.default_apply(algo, deterministic)
        _core.check_apply(algo, apply, deterministic)
        if not isinstance(apply_by_step, int):
            raise ValueError(f"apply_by_step must be an int, got {apply_by_step!r}")
        _core.check_apply_by(apply, apply_by_step, tau)
        self.apply = apply
        self.apply_by_step = apply_by_step
        self._apply_on_arrival = apply == "arrival"
        self._applied_this_round = False
        self._steps_at_apply = 0
        self._applied_after_steps: List[int] = []
        self._params = _param_list(params)
        self._inner = inner
        self.tau = tau
        self.algo = algo
        self.rounds = rounds
        self._average_gradients = average_gradients
        self._verify = verify_final_anchor
        for name, value in (("link_mbit", link_mbit), ("link_rtt", link_rtt)):
            if not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")
        self._link = (float(link_mbit), float(link_rtt))
        self._group = process_group
        if self._group is None and dist.is_available() and dist.is_initialized():
            local = int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size()))
            if local != dist.get_world_size():
                raise ValueError(
                    "the default process group spans several nodes: pass process_group= "
                    "(the ranks of this node, e.g. from dist.new_subgroups())")
            self._group = dist.group.WORLD
        self._group_size = dist.get_world_size(self._group) if self._group is not None else 1
        self._leader_rank = (
            dist.get_global_rank(self._group, 0) if self._group is not None else 0)
        self.is_leader = self._group is None or dist.get_rank(self._group) == 0
        _check_inner(inner)
        self._node = (Node(self._group, self._params[0].device)
                      if self._group is not None and self._group_size > 1 else None)
        # A model under FSDP2: each rank's slice is its own shards.
        self.fsdp2 = is_sharded(self._params)
        if self.fsdp2:
            if rank_slices is False:
                raise ValueError(
                    "rank_slices=False with an FSDP2 model: each rank holds only its own "
                    "shard, so each exchanges it; leave rank_slices unset")
            self._host: Any = ShardMirror(self._params, self._node, len(aggregators))
            self.rank_slices = self._node is not None
            # FSDP2 reduce-scatters the gradients itself.
            self._average_gradients = False
            self._slices = self._host.slices
        else:
            self._host = HostParams(self._params)
            self.rank_slices = self._use_slices(rank_slices, len(aggregators))
            # The slice of the flat parameters each local rank exchanges, by
            # rank; (0, P) for the leader alone.
            self._slices = ([_core.rank_range(self._host.numel, len(aggregators),
                                              self._group_size, k)
                             for k in range(self._group_size)]
                            if self.rank_slices else [(0, self._host.numel)])
        self._slice = self._slices[self._node.rank if self.rank_slices else 0]
        # This process talks to the shards.
        self._exchanges = self.is_leader or self.rank_slices

        if config is None:
            alpha, beta = outer_defaults
            cfg = JobConfig(alpha=alpha, beta=beta)
        else:
            cfg = JobConfig.from_dict(config.to_dict())
        cfg.protocol_version = _core.protocol_version()
        cfg.num_parameters = self._host.numel
        cfg.num_shards = len(aggregators)
        cfg.tau = tau
        cfg.rounds = rounds
        values = _core.apply_algo(algo, cfg.to_dict())
        _core.validate_job_config(values)
        self.config = JobConfig.from_dict(values)
        self._staleness = self.config.max_staleness
        self._join = dict(
            addresses=list(aggregators), job=job, worker_id=worker_id or _default_worker_id(),
            config=values, uplink_codec=uplink_codec, rounds=rounds,
            samples_per_step=float(samples_per_step), ca_file=ca_file, cert_file=cert_file,
            key_file=key_file, token_file=token_file, rejoin=rejoin,
            connect_timeout=float(connect_timeout), update_timeout=float(update_timeout),
            eager_share=float(eager_share), carry_progress=self.carry_progress,
            apply_by_step=self.apply_by_step)
        if self.rank_slices:
            # Each rank joins its own shards; a rank the shards cannot take
            # back heals, and its node-mates with it (_settle).
            self._join.update(local_ranks=self._group_size, local_rank=self._node.rank,
                              num_parameters=self._host.numel, heal=True)
        self._exchange: Optional[Any] = None
        self._final_stats: Dict[str, Any] = {}
        self._connected = False
        self._resume: Optional[Dict[str, Any]] = None
        self._round = 0
        self._anchor_round = 0
        self._steps = 0
        self._steps_in_round = 0
        self._exposed_comm = 0.0
        self._bytes_sent = 0
        self._broken = False
        self._finished = False
        self._left = False

    def connect(self) -> None:
        """Joins the job (local rank 0, or with ``rank_slices`` every rank,
        each its own shards) and sets the parameters to the anchor every
        worker starts from. The first ``step()`` calls it; call it earlier
        to fail early (on every rank at once). After ``load_state_dict`` it
        resumes the saved round with the saved anchor instead."""
        if self._connected:
            return
        self._check_usable("connect")
        try:
            if self.rank_slices and self._resume is None and not self.fsdp2:
                # The node starts from its leader's model, as it does when
                # the leader alone seeds the shards: each rank seeds its slice.
                self._node.broadcast_from_leader(self._host.flat)
            start_round = 0
            if self._exchanges:
                if self.is_leader and any(self._link):
                    check_host_tcp(*self._link)
                if self.rank_slices:
                    start_round = self._node.call("joining the job", self._join_job)
                    start_round = self._node.agree_round(
                        start_round, self._rejoin, "to start at")
                else:
                    start_round = self._join_job()
                self._host.scatter()
            if self.rank_slices:
                self._share_slices()
            else:
                start_round = self._broadcast_start(start_round)
        except BaseException:
            self._broken = True
            raise
        self._round = start_round
        self._anchor_round = start_round
        self._connected = True

    def _join_job(self) -> int:
        """Makes this rank's exchange; the round it starts at. The host copy
        (this rank's slice of it) then holds that round's anchor, plus the
        saved start offset on a resume."""
        resume_round = None
        mine = self._mine()
        if self._resume is not None:
            resume_round = self._resume["round"]
            mine.copy_(self._resume["anchor"])
        else:
            self._host.gather()
        self._exchange = _core.Exchange(
            **self._join, resume_round=resume_round, x=self._x_address(), numel=mine.numel())
        residual = self._resume.get("residual") if self._resume else None
        if residual is not None:
            residual = residual.contiguous()
            self._exchange.restore_residual(residual.data_ptr(), residual.numel())
        start = self._resume.get("start_offset") if self._resume else None
        if start is not None:
            offset, last = start
            offset = offset.contiguous()
            last = last.contiguous() if last is not None else None
            self._exchange.restore_start_offset(
                offset.data_ptr(), last.data_ptr() if last is not None else 0,
                offset.numel())
            mine.add_(offset)  # the round starts at A + e
        return self._exchange.start_round

    def _mine(self) -> torch.Tensor:
        """This rank's slice of the float32 host copy (all of it for the
        leader alone): what its exchange reads Δ from and writes A into."""
        return self._host.view(*self._slice)

    def _x_address(self) -> int:
        return self._mine().data_ptr()

    def _x(self) -> tuple:
        """(address, numel) of _mine(), for the C++ exchange."""
        return self._x_address(), self._slice[1] - self._slice[0]

    def _rejoin(self) -> int:
        """Heals this rank now (its node-mates healed, or it is behind them);
        the round it continues at."""
        times = self._exchange.rejoin(*self._x())
        self._exposed_comm += times["exposed_comm_s"]
        return times["healed_round"]

    def _settle(self, times: Dict[str, Any], next_round: int, what: str) -> int:
        """After an exchange call of every rank (slices): the round the node
        continues at. When any rank healed, the others rejoin too, and the
        ranks agree on one round; then they share their slices, so that every
        rank holds the whole x."""
        healed = times["healed_round"]
        mine = next_round if healed is None else healed
        any_healed = any(h for (h,) in self._node.gather_ints([healed is not None]))
        if any_healed:
            if healed is None:
                mine = self._node.call(f"rejoining {what}", self._rejoin)
            else:
                self._node.call(f"rejoining {what}", lambda: None)
            mine = self._node.agree_round(mine, self._rejoin, what)
        self._host.scatter()
        self._share_slices()
        return mine

    def _share_slices(self) -> None:
        """Every rank's x ← every rank's slice (replicated models; an FSDP2
        rank holds only its own)."""
        if not self.fsdp2:
            self._node.share_slices(self._host.flat, self._slices)

    def _use_slices(self, asked: Optional[bool], num_shards: int) -> bool:
        if self._node is None or asked is False:
            return False
        if num_shards >= self._group_size:
            return True
        if asked:
            raise ValueError(
                f"rank_slices=True needs at least one shard per local rank: the node has "
                f"L={self._group_size} local ranks and the job S={num_shards} shard "
                f"addresses; give S >= L shards, or rank_slices=False")
        if self.is_leader:
            warnings.warn(
                f"co2.Optimizer: S={num_shards} shards for L={self._group_size} local ranks: "
                f"local rank 0 alone exchanges the whole model (each rank its own slice "
                f"needs S >= L)", stacklevel=3)
        return False

    # --- the torch.optim surface ---

    @property
    def param_groups(self) -> List[Dict[str, Any]]:
        """The inner optimizer's param groups (learning-rate schedulers use them)."""
        return self._inner.param_groups

    @property
    def state(self) -> Any:
        """The inner optimizer's per-parameter state."""
        return self._inner.state

    @property
    def defaults(self) -> Dict[str, Any]:
        """The inner optimizer's defaults."""
        return self._inner.defaults

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        """Refused: the parameters are fixed when the job is joined (its
        parameter count is part of the job)."""
        raise ValueError("co2.Optimizer cannot take a param group after it is made: the job's "
                         "parameter count is fixed; pass every parameter to co2.Optimizer")

    def zero_grad(self, set_to_none: Optional[bool] = None) -> None:
        """Zeroes (or, the inner optimizer's default in torch 2, drops) the
        gradients through the inner optimizer."""
        if set_to_none is None:
            self._inner.zero_grad()
        else:
            self._inner.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Any = None) -> Any:
        """One inner step; every ``tau``-th call also ends the round.

        Returns what the inner optimizer's step returns.
        """
        self._check_usable("step")
        self.connect()
        if self.rounds and self._round >= self.rounds:
            raise Error("FAILED_PRECONDITION",
                        f"step in round {self._round}, past the job's last round {self.rounds - 1}")
        try:
            if self._group_size > 1 and self._average_gradients:
                self._average_grads()
            loss = self._inner.step(closure)
            self._steps += 1
            self._steps_in_round += 1
            if self._steps_in_round == self.tau:
                self._boundary()
            elif self._apply_on_arrival and not self._applied_this_round:
                self._apply_if_arrived()
        except BaseException:
            self._broken = True
            raise
        return loss

    def finish(self) -> None:
        """Ends this worker's part of the job.

        A partial round is closed; with co2 the update of the last round is
        waited for and applied, so every worker ends on the same final anchor;
        that anchor is checked against the shards' (``verify_final_anchor``);
        then the worker leaves the job.
        """
        self._end(leaving=False)

    def leave(self) -> None:
        """Leaves the job before its last round (a job that shrinks).

        A partial round is closed; with co2 the update of the round this
        worker computed last is waited for and applied, so its Δ is counted
        and the parameters are that anchor; then the worker leaves the job,
        and the shards no longer wait for it from the next round. Every rank
        of a node calls it at the same step, as ``finish()``. After it the
        optimizer is finished (``left`` is True).
        """
        self._end(leaving=True)

    @property
    def left(self) -> bool:
        """Whether this worker left the job with ``leave()``."""
        return self._left

    def _end(self, leaving: bool) -> None:
        if self._finished:
            return
        self._check_usable("leave" if leaving else "finish")
        self.connect()
        try:
            if self.rank_slices:
                # The leader decides whether the node leaves or finishes.
                leaving = bool(self._node.from_leader(int(leaving)))
            if self._steps_in_round > 0:
                self._boundary()
            last = self._round if leaving else self.rounds
            owed = _core.owed_update(self._staleness, last, self._round)
            if owed is not None and self.rank_slices:
                self._host.gather()
                times = self._node.call("draining the last update",
                                        lambda: self._exchange.drain(owed, *self._x()))
                self._exposed_comm += times["exposed_comm_s"]
                self._anchor_round = self._settle(times, self._round + 1, "at the end")
            elif owed is not None:
                if self._exchange is not None:
                    self._host.gather()
                    times = self._exchange.drain(owed, self._host.address, self._host.numel)
                    self._exposed_comm += times["exposed_comm_s"]
                    self._host.scatter()
                self._broadcast_params()
                self._anchor_round = self._round + 1
            if self.rank_slices:
                # Every rank checks its slice; a mismatch on one fails all.
                if self._verify and not leaving:
                    self._node.call("verifying the final anchor",
                                    lambda: self._exchange.verify_anchor(self._anchor_round))
                self._exchange.leave()
                self._final_stats = self._exchange.stats()
                self._exchange = None
            elif self._exchange is not None:
                if self._verify and not leaving:
                    self._exchange.verify_anchor(self._anchor_round)
                self._exchange.leave()
                # The streams close now, while the shards are up.
                self._final_stats = self._exchange.stats()
                self._exchange = None
        except BaseException:
            self._broken = True
            raise
        self._finished = True
        self._left = leaving

    # --- what a user logs ---

    @property
    def round(self) -> int:
        """The round being computed (after ``finish()``: the rounds done)."""
        return self._round

    @property
    def anchor_round(self) -> int:
        """The round of the anchor the parameters were last set to: the
        anchor that starts that round, which holds the outer updates of the
        first ``anchor_round - config.max_staleness`` rounds. An update
        applied on arrival sets it as the round's boundary would."""
        return self._anchor_round

    def anchor(self) -> Optional[torch.Tensor]:
        """A float32 CPU copy of the anchor as this worker holds it now (the
        last update it applied included), flat in parameter order: the model
        every worker and shard agree on. With eager updates or carried
        progress each worker's parameters are its own offset from it, so
        this is the model to evaluate or save mid-training. After
        ``finish()``: the final anchor (the parameters). On local rank 0;
        None on the other ranks and before the first ``step()`` or
        ``connect()``.

        With ``rank_slices`` each rank holds its slice of the anchor only:
        then this is a collective that every rank of the node calls at the
        same point, and every rank gets the whole anchor, gathered from the
        slices (after ``finish()``: the parameters, on every rank, with no
        collective)."""
        if self.fsdp2:
            return self._local_anchor()
        if self._finished:
            if not (self.is_leader or self.rank_slices):
                return None
            return self._host.flat.detach().to(device="cpu", dtype=torch.float32, copy=True)
        if self._exchange is None:
            return None
        out = torch.zeros(self._host.numel, dtype=torch.float32, device=self._node_device())
        mine = torch.empty(self._slice[1] - self._slice[0], dtype=torch.float32)
        self._exchange.copy_anchor(mine.data_ptr(), mine.numel())
        out[self._slice[0]:self._slice[1]].copy_(mine)
        if self.rank_slices:
            self._node.share_slices(out, self._slices)
        return out.cpu()

    def _local_anchor(self) -> Optional[torch.Tensor]:
        """FSDP2: the anchor of this rank's own shards, flat in parameter
        order (the parameters after ``finish()``)."""
        if self._finished:
            self._host.gather()
            return self._host.local().clone()
        if self._exchange is None:
            return None
        self._exchange.copy_anchor(self._host.address, self._host.buffer.numel())
        anchor = self._host.local().clone()
        self._host.gather()  # the mirror holds x again
        return anchor

    def memory(self) -> Dict[str, int]:
        """Bytes of co2's own state in this process (beside the model, its
        gradients and the inner optimizer's state): ``"anchor"`` (the
        anchor, with carried progress or eager updates their offset),
        ``"client_buffers"`` (the encoded Δ kept until its update arrives,
        the received update, a lossy uplink's residual), ``"host_mirror"``
        (the float32 host copy of parameters that are not float32 on the
        CPU, or of an FSDP2 rank's shards) and ``"total"``. With
        ``rank_slices`` each rank holds its slice's, about 1/L of the
        leader-alone figure; 0 on a rank that does not exchange."""
        state = self._exchange.memory() if self._exchange is not None else {
            "anchor": 0, "client_buffers": 0}
        mirror = self._host.mirror_bytes() if self._exchanges else 0
        out = {"anchor": int(state["anchor"]), "client_buffers": int(state["client_buffers"]),
               "host_mirror": int(mirror)}
        out["total"] = sum(out.values())
        return out

    def _node_device(self) -> torch.device:
        # Where the node's collectives take tensors: the parameters' device
        # with slices (an NCCL group takes CUDA tensors only), else the CPU.
        return self._params[0].device if self.rank_slices else torch.device("cpu")

    @property
    def exposed_comm_seconds(self) -> float:
        """Seconds this process waited for the network (on local rank 0, or
        with ``rank_slices`` on each rank, for its own shards)."""
        return self._exposed_comm

    @property
    def bytes_sent(self) -> int:
        """Δ payload bytes this process pushed (with ``rank_slices``: this
        rank's slice, about 1/L of the model's)."""
        return self._bytes_sent

    @property
    def bytes_received(self) -> int:
        """Update payload bytes this worker received."""
        return self._client_stats().get("bytes_received", 0)

    def stats(self) -> Dict[str, Any]:
        """Counters: round, steps, exposed_comm_s, bytes_sent, bytes_received,
        reconnects, and with ``apply="arrival"`` applied_after_steps: per
        round, the inner steps done when its owed update was applied (0: at
        the boundary)."""
        client = self._client_stats()
        return {
            "applied_after_steps": list(self._applied_after_steps),
            "round": self._round,
            "steps": self._steps,
            "exposed_comm_s": self._exposed_comm,
            "bytes_sent": self._bytes_sent,
            "bytes_received": client.get("bytes_received", 0),
            "reconnects": client.get("reconnects", 0),
        }

    # --- internals ---

    def _client_stats(self) -> Dict[str, Any]:
        if self._exchange is not None:
            return self._exchange.stats()
        return self._final_stats

    def _check_usable(self, what: str) -> None:
        if self._finished:
            ended = "leave()" if self._left else "finish()"
            raise Error("FAILED_PRECONDITION", f"co2.Optimizer.{what} after {ended}")
        if self._broken:
            raise Error("FAILED_PRECONDITION", f"co2.Optimizer.{what} after an error")

    def _boundary(self) -> None:
        next_round = self._round + 1
        if self.rank_slices:
            self._host.gather()
            times = self._node.call("the round boundary", lambda: self._exchange.boundary(
                self._round, self._steps_in_round, *self._x()))
            self._exposed_comm += times["exposed_comm_s"]
            self._bytes_sent += times["bytes_sent"]
            next_round = self._settle(times, next_round, f"after round {self._round}")
        else:
            if self._exchange is not None:
                self._host.gather()
                times = self._exchange.boundary(
                    self._round, self._steps_in_round, self._host.address, self._host.numel)
                self._exposed_comm += times["exposed_comm_s"]
                self._bytes_sent += times["bytes_sent"]
                self._host.scatter()
            self._broadcast_params()
        self._anchor_round = next_round
        self._round = next_round
        self._steps_in_round = 0
        if self._apply_on_arrival:
            self._applied_after_steps.append(
                self._steps_at_apply if self._applied_this_round else 0)
        self._applied_this_round = False

    def _apply_if_arrived(self) -> None:
        # The leader decides (from step apply_by_step on, an update not back
        # yet is due too, and waited for); with several ranks its decision
        # reaches all of them at this step, so that they apply it at the same
        # step.
        apply = (self._exchange is not None
                 and self._exchange.apply_due(self._round, self._steps_in_round))
        if self.rank_slices:
            # Applied once every rank's slice is due (arrived, or from
            # apply_by_step on, owed: then every rank waits for its own).
            if all(due for (due,) in self._node.gather_ints([apply])):
                self._apply_slices()
            return
        if self._group_size > 1:
            flag = torch.tensor([1 if apply else 0], dtype=torch.int32,
                                device=self._params[0].device)
            dist.broadcast(flag, src=self._leader_rank, group=self._group)
            apply = bool(flag.item())
        if not apply:
            return
        if self._exchange is not None:
            self._host.gather()
            times = self._exchange.apply_owed(self._round, self._steps_in_round,
                                              self._host.address, self._host.numel)
            self._exposed_comm += times["exposed_comm_s"]
            self._host.scatter()
        self._broadcast_params()
        # The anchor the parameters now hold is the one the boundary would set.
        self._anchor_round = self._round + 1
        self._applied_this_round = True
        self._steps_at_apply = self._steps_in_round

    def _apply_slices(self) -> None:
        self._host.gather()
        times = self._node.call("applying the owed update", lambda: self._exchange.apply_owed(
            self._round, self._steps_in_round, *self._x()))
        self._exposed_comm += times["exposed_comm_s"]
        settled = self._settle(times, self._round + 1, f"in round {self._round}")
        if settled != self._round + 1:
            # A heal: the node continues at that round's start, as a
            # boundary that heals does.
            self._round = self._anchor_round = settled
            self._steps_in_round = 0
            return
        self._anchor_round = self._round + 1
        self._applied_this_round = True
        self._steps_at_apply = self._steps_in_round

    def _average_grads(self) -> None:
        """The node's mean gradient, in buckets of at most GRAD_BUCKET_BYTES
        as DDP's (one all-reduce per bucket; a gradient larger than a bucket
        is reduced in place), so the copy it takes stays bounded."""
        bucket: List[torch.Tensor] = []
        size = 0
        for g in (p.grad for p in self._params if p.grad is not None):
            n = g.numel() * g.element_size()
            if bucket and size + n > GRAD_BUCKET_BYTES:
                self._average_bucket(bucket)
                bucket, size = [], 0
            bucket.append(g)
            size += n
        if bucket:
            self._average_bucket(bucket)

    def _average_bucket(self, grads: List[torch.Tensor]) -> None:
        if len(grads) == 1 and grads[0].is_contiguous():
            dist.all_reduce(grads[0], group=self._group)
            grads[0].div_(self._group_size)
            return
        flat = torch._utils._flatten_dense_tensors(grads)
        dist.all_reduce(flat, group=self._group)
        flat.div_(self._group_size)
        for g, avg in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads)):
            g.copy_(avg)

    def _broadcast_params(self) -> None:
        if self._group_size <= 1:
            return
        dist.broadcast(self._host.flat, src=self._leader_rank, group=self._group)

    def _broadcast_start(self, start_round: int) -> int:
        if self._group_size <= 1:
            return start_round
        device = self._params[0].device
        t = torch.tensor([start_round], dtype=torch.int64, device=device)
        dist.broadcast(t, src=self._leader_rank, group=self._group)
        self._broadcast_params()
        return int(t.item())
