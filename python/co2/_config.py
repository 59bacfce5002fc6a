"""co2.JobConfig: a job's outer-step settings (proto co2.v1.JobConfig)."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict

from . import _core

# The model size the check of a new config assumes (any size passes).
_ANY_PARAMETERS = 1 << 62


@dataclasses.dataclass
class JobConfig:
    """The settings every worker of a job must agree on (docs/algorithm.md).

    A value out of range raises ValueError naming the field when the config
    is made. The first worker's Join fixes them on the shards; a worker that
    asks for others is refused with ``co2.Error("FAILED_PRECONDITION",
    ...)`` naming the first field that differs. Defaults are the C++ ones
    (``common::DefaultJobConfig``). ``co2.Optimizer`` fills in the fields it
    knows: ``protocol_version``, ``num_parameters``, ``num_shards``, ``tau``,
    ``rounds`` and, from the algorithm, ``max_staleness`` (and ``alpha``,
    ``beta``, ``gap_penalty``, ``clip`` for localsgd and slowmo).

    Attributes:
        alpha: outer learning rate, > 0.
        beta: outer momentum, in [0, 1).
        momentum: ``"heavy_ball"``, ``"nesterov"`` or ``"delayed_nesterov"``
            (the momentum steps once every ``momentum_period`` rounds).
        momentum_period: N of ``"delayed_nesterov"``, >= 1 there; 0 otherwise.
        gap_penalty: ``"none"``, ``"constant"`` or ``"gap_aware"``.
        penalty_lambda: Λ for ``gap_penalty="constant"``, >= 1.
        clip: outer-momentum clipping: ``"none"``, ``"value"`` or ``"adaptive"``.
        clip_value: φ (``"value"``) or k (``"adaptive"``), > 0.
        downlink_codec: the update's encoding: ``"fp32"``, ``"bf16"`` or ``"int8"``.
        min_workers: quorum for closing a round at its deadline.
        round_timeout_ms: a round's deadline from its first chunk.
        max_staleness: 1 for co2 (one-round-stale), 0 for synchronous.
        tau: inner steps per round.
        rounds: the job's number of rounds.
        deterministic: sum each round's contributions exactly on the shards,
            so that a run is a function of its seeds and settings (costs the
            shards 8 bytes per element of accumulator instead of 4; see
            docs/algorithm.md, "Order-independent sums").
        outlier_ratio: k of the shards' outlier rule: a contribution whose
            norm is more than k times the median of its chunk's (with at
            least 3) is held out of the mean; >= 0, 0 turns it off (see
            docs/algorithm.md, "Robust rounds").
        protocol_version: the wire protocol (set by the package).
        num_parameters: P, the flat parameter count (set from the model).
        num_shards: S, the number of aggregator shards (set from the addresses).
    """

    alpha: float = 1.0
    beta: float = 0.0
    momentum: str = "heavy_ball"
    momentum_period: int = 0
    gap_penalty: str = "none"
    penalty_lambda: float = 1.0
    clip: str = "none"
    clip_value: float = 3.0
    downlink_codec: str = "fp32"
    min_workers: int = 1
    round_timeout_ms: int = 60000
    max_staleness: int = 1
    tau: int = 8
    rounds: int = 0
    deterministic: bool = False
    outlier_ratio: float = 20.0
    protocol_version: int = 2
    num_parameters: int = 0
    num_shards: int = 0

    def __post_init__(self) -> None:
        # A bad setting is a ValueError here, as torch.optim's constructors
        # raise; the fields the optimizer fills in (the protocol, the model's
        # size against the shards) are checked once it has (validate()).
        values = self.to_dict()
        values["protocol_version"] = _core.protocol_version()
        values["num_shards"] = 1
        values["num_parameters"] = _ANY_PARAMETERS
        _core.validate_job_config(values)

    def to_dict(self) -> Dict[str, Any]:
        """Every field by its proto name."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Dict[str, Any]) -> "JobConfig":
        """The JobConfig of a dict of proto field names (unknown: ValueError)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ValueError(f"JobConfig has no field {unknown[0]!r}")
        return cls(**values)

    def validate(self) -> None:
        """Raises ValueError naming the first field out of range, with its value."""
        _core.validate_job_config(self.to_dict())
