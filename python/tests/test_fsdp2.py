"""A model sharded by FSDP2 (fully_shard, torch >= 2.6): 2 workers × 2
local ranks under torchrun (Gloo, a CPU mesh), each rank exchanging its own
shards, padded to whole service shards."""

from __future__ import annotations

import subprocess

import pytest
import torch

import co2
from torchrun_nodes import run_nodes, torchrun

# Not imported on older torches: torch 1.13's fsdp package does not even
# import under Python 3.11.
if tuple(int(v) for v in torch.__version__.split(".")[:2]) < (2, 6):
    pytest.skip(f"torch {torch.__version__} has no FSDP2 (fully_shard, torch >= 2.6)",
                allow_module_level=True)

BLOCK = 65536
HIDDEN = 300  # P of the model: 16·300 + 300 + 300 + 1 = 5401


def test_fsdp2_ranks_exchange_their_own_shards(tmp_path):
    with co2.local_aggregator(num_shards=4) as agg:
        ranks = run_nodes(tmp_path, agg.addresses, "fsdp2", "fsdp2_worker.py",
                          ["--hidden", str(HIDDEN), "--rounds", "4"])
    assert all(r["fsdp2"] and r["rank_slices"] for r in ranks)
    # Every rank of both workers ends on one model (finish() checked each
    # rank's slice against its shards' anchor), and rank k of one worker
    # holds the anchor of rank k of the other.
    assert len({r["full"] for r in ranks}) == 1
    for k in range(2):
        assert ranks[k]["anchor"] == ranks[2 + k]["anchor"]
        assert ranks[k]["anchor_is_local_params"]
    assert all((r["round"], r["anchor_round"]) == (4, 5) for r in ranks)
    # Each rank's slice is two whole shards of one block: its FSDP2 shard
    # (rank 0 holds the last layer's one row and bias, rank 1 none of them),
    # padded to the slice's end.
    assert [r["slice"] for r in ranks[:2]] == [[0, 2 * BLOCK], [2 * BLOCK, 4 * BLOCK]]
    assert [r["local_numel"] for r in ranks[:2]] == [150 * 16 + 150 + 300 + 1,
                                                     150 * 16 + 150]
    assert ranks[1]["state_slice"] == [2 * BLOCK, 4 * BLOCK]
    for r in ranks:
        q = r["slice"][1] - r["slice"][0]
        # co2's state: A and the carried offset, the send and receive
        # buffers (fp32), the float32 mirror of the shards.
        assert r["memory"] == {"anchor": 8 * q, "client_buffers": 8 * q,
                               "host_mirror": 4 * q, "total": 20 * q}, r["memory"]
        assert r["bytes_sent"] == 4 * 4 * q, r["bytes_sent"]


def test_fsdp2_refuses_the_leader_alone_and_uneven_shards(tmp_path):
    with co2.local_aggregator(num_shards=3) as agg:
        for job, extra, message in (
                ("alone", ["--rank_slices", "off"], "rank_slices=False with an FSDP2 model"),
                ("uneven", [], "a multiple of its L=2 local ranks as shards")):
            run = subprocess.run(
                torchrun("fsdp2_worker.py",
                         ["--aggregators", ",".join(agg.addresses), "--job", job,
                          "--out", str(tmp_path), *extra], str(tmp_path / job)),
                capture_output=True, text=True, timeout=300)
            assert run.returncode != 0, job
            assert message in run.stdout + run.stderr, (job, run.stderr[-2000:])
