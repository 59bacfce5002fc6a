"""co2.local_aggregator: aggregator shards on loopback, for experiments and tests."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from typing import Iterator, List, Optional, Sequence

from ._errors import Error

_LISTENING = re.compile(r"listening on port (\d+)")


def find_aggregator() -> str:
    """The co2-aggregator binary: $CO2_AGGREGATOR, the one installed with
    this package (``pip install``), the build tree this package was built in,
    or the PATH."""
    explicit = os.environ.get("CO2_AGGREGATOR")
    if explicit:
        return explicit
    here = os.path.dirname(os.path.abspath(__file__))
    for candidate in (os.path.join(here, "_bin", "co2-aggregator"),
                      os.path.join(here, "..", "..", "bin", "co2-aggregator")):
        if os.access(candidate, os.X_OK):
            return os.path.normpath(candidate)
    found = shutil.which("co2-aggregator")
    if found:
        return found
    raise FileNotFoundError(
        "co2-aggregator not found: the package was installed without it; "
        "pip install co2 (the wheel carries it), set CO2_AGGREGATOR, or put it on the PATH")


class LocalAggregator:
    """Running shards: ``addresses`` (``127.0.0.1:port``, in shard order) and
    ``checkpoint_dir`` (None unless asked for)."""

    def __init__(self, addresses: List[str], processes: List[subprocess.Popen],
                 checkpoint_dir: Optional[str], logs: List[List[str]]) -> None:
        self.addresses = addresses
        self.processes = processes
        self.checkpoint_dir = checkpoint_dir
        self._logs = logs

    def log(self, shard: int) -> str:
        """What shard ``shard`` has written to stderr so far."""
        return "".join(self._logs[shard])

    def kill(self, shard: int) -> None:
        """Kills shard ``shard`` with SIGKILL (fault tests)."""
        self.processes[shard].kill()
        self.processes[shard].wait(timeout=10)


def _drain(stream, lines: List[str], port: List[int], ready: threading.Event) -> None:
    for line in iter(stream.readline, ""):
        lines.append(line)
        m = _LISTENING.search(line)
        if m and not ready.is_set():
            port.append(int(m.group(1)))
            ready.set()
    ready.set()


def _stop(processes: Sequence[subprocess.Popen], grace: float) -> None:
    for p in processes:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for p in processes:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)


@contextlib.contextmanager
def local_aggregator(num_shards: int = 1, *, checkpoint_dir: Optional[str] = None,
                     checkpoints: bool = False, round_timeout: str = "60s",
                     tls_cert: str = "", tls_key: str = "", tls_client_ca: str = "",
                     job_tokens_file: str = "", extra_args: Sequence[str] = (),
                     start_timeout: float = 30.0,
                     binary: Optional[str] = None) -> Iterator[LocalAggregator]:
    """Starts ``num_shards`` co2-aggregator processes on free loopback ports
    and stops them on exit, also on an exception. Plaintext unless
    ``tls_cert`` is given (scripts/make-certs.sh makes the files).

    Args:
        num_shards: shards of the service.
        checkpoint_dir: where the shards keep their checkpoints; with
            ``checkpoints=True`` and no directory, a temporary one.
        round_timeout: the shards' --round_timeout.
        tls_cert, tls_key: the shards' certificate and key (TLS).
        tls_client_ca: with TLS, require client certificates signed by it (mTLS).
        job_tokens_file: with TLS, the shards' per-job bearer tokens.
        extra_args: more co2-aggregator flags, for every shard.
        start_timeout: seconds a shard may take to listen.
        binary: the co2-aggregator to run (default: ``find_aggregator()``).

    Yields:
        a LocalAggregator; pass its ``addresses`` to ``co2.Optimizer``.
    """
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    binary = binary or find_aggregator()
    temp = None
    if checkpoints and checkpoint_dir is None:
        temp = tempfile.TemporaryDirectory(prefix="co2-checkpoints-")
        checkpoint_dir = temp.name
    processes: List[subprocess.Popen] = []
    logs: List[List[str]] = []
    try:
        addresses = []
        for shard in range(num_shards):
            args = [binary, "--host=127.0.0.1", "--port=0", "--metrics_port=-1",
                    f"--shard_index={shard}", f"--num_shards={num_shards}",
                    f"--round_timeout={round_timeout}"]
            if tls_cert:
                args += [f"--tls_cert={tls_cert}", f"--tls_key={tls_key}"]
                if tls_client_ca:
                    args.append(f"--tls_client_ca={tls_client_ca}")
                if job_tokens_file:
                    args.append(f"--job_tokens_file={job_tokens_file}")
            else:
                args.append("--insecure")
            if checkpoint_dir:
                args.append(f"--checkpoint_dir={checkpoint_dir}")
            args.extend(extra_args)
            p = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True)
            processes.append(p)
            lines: List[str] = []
            logs.append(lines)
            port: List[int] = []
            ready = threading.Event()
            threading.Thread(target=_drain, args=(p.stderr, lines, port, ready),
                             daemon=True).start()
            if not ready.wait(start_timeout) or not port:
                raise Error("UNAVAILABLE",
                            f"shard {shard} did not start listening within {start_timeout} s: "
                            + "".join(lines)[-2000:])
            addresses.append(f"127.0.0.1:{port[0]}")
        yield LocalAggregator(addresses, processes, checkpoint_dir, logs)
    finally:
        _stop(processes, grace=10.0)
        if temp is not None:
            temp.cleanup()
