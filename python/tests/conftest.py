"""Shared helpers: running worker processes with deadlines."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from typing import Dict, List, Sequence

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD_DIR = os.environ.get("CO2_BUILD_DIR", os.path.join(HERE, "..", "..", "build"))


def pytest_terminal_summary(terminalreporter) -> None:
    """Names the torch and Python the suite ran on (make test runs it on two
    torches), also under -q."""
    import torch
    terminalreporter.write_line(f"co2 suite on torch {torch.__version__}, Python "
                                f"{sys.version.split()[0]} ({sys.executable})")


def start_worker(args: Sequence[str]) -> subprocess.Popen:
    """A tests/worker.py process with `args`."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, os.path.join(HERE, "worker.py"), *args],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def results(processes: List[subprocess.Popen], timeout: float = 300) -> List[Dict]:
    """Each worker's JSON result; fails the test on a crash or a hang."""
    out = []
    for p in processes:
        try:
            stdout, stderr = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in processes:
                q.kill()
            pytest.fail(f"worker did not finish within {timeout} s")
        assert p.returncode == 0, f"worker exited {p.returncode}: {stderr[-3000:]}"
        lines = [line for line in stdout.splitlines() if line.startswith("{")]
        assert lines, f"worker printed no result: {stdout[-2000:]} {stderr[-3000:]}"
        out.append(json.loads(lines[-1]))
    return out


def wait_for_line(p: subprocess.Popen, text: str, timeout: float = 120,
                  stream: str = "stdout") -> str:
    """Reads p's stdout (or stderr) until a line containing `text` (fails
    after timeout)."""
    pipe = getattr(p, stream)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([pipe], [], [], deadline - time.monotonic())
        if not ready:
            break
        line = pipe.readline()
        if not line:
            rest = p.stderr.read()[-3000:] if stream == "stdout" else ""
            pytest.fail(f"worker ended before printing {text!r} on {stream}: {rest}")
        if text in line:
            return line
    p.kill()
    pytest.fail(f"worker did not print {text!r} on {stream} within {timeout} s")


def wait_for_live_workers(addresses: Sequence[str], job: str, count: int,
                          timeout: float = 120) -> None:
    """Polls co2-admin until shard 0 counts `count` live workers in `job`."""
    admin = binary("bin", "co2-admin")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        listing = subprocess.run([admin, f"--aggregators={addresses[0]}", "list"],
                                 capture_output=True, text=True, timeout=30).stdout
        for line in listing.splitlines():
            fields = line.split()
            if len(fields) > 4 and fields[1] == job and fields[4] == str(count):
                return
        time.sleep(0.2)  # polling the shard, with the deadline above
    pytest.fail(f"job {job} did not reach {count} live workers within {timeout} s")


def binary(*parts: str) -> str:
    """A program of the build (CO2_BUILD_DIR); a test that needs one the
    build did not make fails: a skip would let the suite pass without it."""
    path = os.path.join(BUILD_DIR, *parts)
    if not os.access(path, os.X_OK):
        pytest.fail(f"{path} is not built (CO2_BUILD_DIR={BUILD_DIR}): build it first")
    return path
