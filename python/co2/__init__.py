"""co2 for PyTorch: train across nodes joined by slow links (docs/python.md).

    import torch, co2
    inner = torch.optim.AdamW(model.parameters(), lr=1e-3)
    opt = co2.Optimizer(model.parameters(), inner, tau=12, rounds=100,
                        aggregators=["shard-0:50051", "shard-1:50051"],
                        job="run-1")
    for x, y in loader:
        opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()
    opt.finish()

``co2.local_aggregator(num_shards=2)`` starts shards on loopback for
experiments.
"""

from ._errors import Error
from . import _core
from ._config import JobConfig
from ._host_tcp import HostTcpWarning, check_host_tcp
from ._local import LocalAggregator, find_aggregator, local_aggregator

__version__: str = _core.__version__


def __getattr__(name: str):
    # co2.Optimizer imports torch on first use, so that the co2 and
    # co2-aggregator commands (and shards started from Python) need no torch.
    if name == "Optimizer":
        from ._optimizer import Optimizer
        return Optimizer
    raise AttributeError(f"module 'co2' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | {"Optimizer"})


def tune_malloc() -> None:
    """Sets glibc's malloc for a training process, as co2-train does: one
    arena, and buffers up to 32 MiB kept in the heap instead of mapped and
    unmapped every step. Torch frees and allocates its activations and
    gradients every step; with glibc's defaults the kernel faults in and
    zeroes their pages each time, which made the Fashion-MNIST CNN's step
    3-4 x slower here (docs/python.md). Call it first in a training script;
    the package never changes the allocator on its own."""
    _core.keep_large_buffers_in_heap()


__all__ = ["Error", "HostTcpWarning", "JobConfig", "LocalAggregator", "Optimizer",
           "check_host_tcp", "find_aggregator", "local_aggregator", "tune_malloc"]
