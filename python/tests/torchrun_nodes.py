"""Nodes of 2 ranks under torchrun, started at once against one service:
the helpers of the tests of rank slices and FSDP2."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from typing import Dict, List, Sequence

import pytest

from conftest import wait_for_live_workers

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(script: str, args: Sequence[str], log_dir: str) -> List[str]:
    """The command line of one node of 2 ranks running ``script`` (in this
    folder), with a static rendezvous on a port of its own."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes=1",
            "--nproc_per_node=2", "--master_addr=127.0.0.1", f"--master_port={free_port()}",
            "--redirects", "1", "--tee", "1", "--log_dir", log_dir,
            os.path.join(HERE, script), *args]


def run_nodes(tmp_path, addresses: Sequence[str], job: str, script: str,
              args: Sequence[str], nodes: int = 2) -> List[Dict]:
    """``nodes`` nodes of 2 ranks each, each run as ``script --aggregators
    ... --job JOB --worker_id node-N --node_index N --out DIR --wait_for_go
    ARGS``; once all joined the job they are let go. Every rank's JSON
    result (DIR/node-N-RANK.json), node by node."""
    out = tmp_path / job
    out.mkdir()
    procs = []
    for node in range(nodes):
        procs.append(subprocess.Popen(
            torchrun(script, ["--aggregators", ",".join(addresses), "--job", job,
                              "--worker_id", f"node-{node}", "--node_index", str(node),
                              "--out", str(out), "--wait_for_go", *args],
                     str(tmp_path / f"{job}-logs-{node}")),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=dict(os.environ, OMP_NUM_THREADS="1")))
    # Every node is a member before any trains: every round has them all.
    try:
        wait_for_live_workers(addresses, job, nodes)
    except pytest.fail.Exception:
        for p in procs:
            p.kill()
        stderr = "\n---\n".join(p.communicate()[1][-2000:] for p in procs)
        pytest.fail(f"job {job}: the {nodes} nodes did not all join; their stderr:\n{stderr}")
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    for p in procs:
        try:
            _, stderr = p.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"job {job} did not finish within 300 s")
        assert p.returncode == 0, stderr[-4000:]
    results = []
    for node in range(nodes):
        for rank in range(2):
            with open(out / f"node-{node}-{rank}.json") as f:
                results.append(json.load(f))
    return results
