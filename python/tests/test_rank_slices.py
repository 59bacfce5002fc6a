"""Rank slices: 2 workers × 2 local ranks under torchrun (Gloo), each rank
exchanging its own slice of the model, against the same job with local rank
0 alone exchanging the whole model."""

from __future__ import annotations

import json
import os
import subprocess
from typing import Dict, List

import pytest

import co2
from torchrun_nodes import run_nodes, torchrun

# P = 18·14563 + 1 = 262135, just under 4 blocks of 65,536: S = 2 and 4 both
# split it into two slices of about P/2.
HIDDEN = 14563


def _run_job(tmp_path, agg, job: str, slices: str, extra: List[str] = ()) -> List[Dict]:
    """Two nodes of 2 ranks each, at once; every rank's JSON result."""
    return run_nodes(tmp_path, agg.addresses, job, "node_worker.py",
                     ["--deterministic", "--hidden", str(HIDDEN), "--lr", "0.002",
                      "--rank_slices", slices, *extra])


@pytest.mark.parametrize("num_shards", [2, 4])
def test_rank_slices_end_bit_identical_to_the_leader_alone(tmp_path, num_shards):
    with co2.local_aggregator(num_shards=num_shards) as agg:
        alone = _run_job(tmp_path, agg, f"alone-{num_shards}", "off")
        sliced = _run_job(tmp_path, agg, f"sliced-{num_shards}", "default")
    assert [r["rank_slices"] for r in alone] == [False] * 4
    # S >= L: on by default.
    assert [r["rank_slices"] for r in sliced] == [True] * 4
    leader = alone[0]
    assert leader["anchor"] is not None and (leader["round"], leader["anchor_round"]) == (4, 5)
    # Every rank of both nodes ends on the leader-alone run's parameters and
    # anchor, bit for bit; each holds the whole anchor (gathered slices).
    assert {r["params"] for r in alone + sliced} == {leader["params"]}
    assert {r["anchor"] for r in sliced} == {leader["anchor"]}
    assert all((r["round"], r["anchor_round"]) == (4, 5) for r in sliced)
    # Each rank pushed its slice: the two slices of a node make up what the
    # leader alone pushes, about half each.
    for node in (0, 2):
        pair = [sliced[node]["bytes_sent"], sliced[node + 1]["bytes_sent"]]
        assert sum(pair) == alone[node]["bytes_sent"], (pair, alone[node]["bytes_sent"])
        for b in pair:
            assert 0.45 < b / alone[node]["bytes_sent"] < 0.55, pair
    assert alone[1]["bytes_sent"] == alone[3]["bytes_sent"] == 0
    # A rank's state holds its split.
    assert {"local_ranks", "num_shards", "slice", "rank_slices"} <= set(sliced[1]["state"])


def test_a_rank_saves_its_slice_and_resumes_only_the_same_split(tmp_path):
    with co2.local_aggregator(num_shards=4) as agg:
        sliced = _run_job(tmp_path, agg, "state", "default", ["--check_state"])
    p = 18 * HIDDEN + 1
    slices = []
    for r in sliced:
        c = r["checks"]
        assert (c["local_ranks"], c["num_shards"]) == (2, 4)
        begin, end = c["slice"]
        slices.append((begin, end))
        # The state holds this rank's slice of the anchor; anchor() gathers
        # the whole one, the same on every rank.
        assert c["state_anchor_numel"] == end - begin
        assert c["anchor_numel"] == p
        assert c["anchor_same_on_every_rank"] and c["state_anchor_is_my_slice"]
        # An optimizer over 2 shards refuses it, naming S.
        assert c["refused"] is not None and "num_shards=4" in c["refused"], c["refused"]
    # The two ranks' slices tile the model.
    assert slices[0][0] == 0 and slices[0][1] == slices[1][0] and slices[1][1] == p
    assert slices[:2] == slices[2:]


@pytest.mark.parametrize("by_step,late", [(0, False), (1, False), (0, True)])
def test_rank_slices_apply_on_arrival_at_one_step(tmp_path, by_step, late):
    # Every rank applies when every rank's slice has arrived (by_step 1: all
    # wait for their own at step 1), so the ranks stay identical after
    # every step and record the same steps. late: rank 1's slice arrives a
    # step after rank 0's, and rank 0 waits for it.
    with co2.local_aggregator(num_shards=2) as agg:
        run = subprocess.run(
            torchrun("node_worker.py",
                     ["--aggregators", ",".join(agg.addresses), "--job", "arrival",
                      "--apply", "arrival", "--apply_by_step", str(by_step),
                      "--out", str(tmp_path), *(["--late_rank1"] if late else [])],
                     str(tmp_path / "logs")),
            capture_output=True, text=True, timeout=300,
            env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert run.returncode == 0, run.stderr[-4000:]
    [line] = [l[l.index("{"):] for l in run.stdout.splitlines() if "{" in l]
    r = json.loads(line)
    assert r["same_every_step"] and r["same_at_end"]
    assert (r["round"], r["anchor_round"]) == (4, 5)
    ranks = []
    for rank in range(2):
        with open(tmp_path / f"node-0-{rank}.json") as f:
            ranks.append(json.load(f))
    assert [x["rank_slices"] for x in ranks] == [True, True]
    assert ranks[0]["applied_after_steps"] == ranks[1]["applied_after_steps"]
    assert len(ranks[0]["applied_after_steps"]) == 4
    if by_step:
        assert ranks[0]["applied_after_steps"] == [0, 1, 1, 1]
    if late:
        assert ranks[0]["applied_after_steps"] == [0, 2, 2, 2]


def test_rank_slices_need_a_shard_per_local_rank(tmp_path):
    # S = 1 < L = 2: asked for explicitly, refused by name.
    with co2.local_aggregator(num_shards=1) as agg:
        run = subprocess.run(
            torchrun("node_worker.py",
                     ["--aggregators", ",".join(agg.addresses), "--job", "few",
                      "--rank_slices", "on"], str(tmp_path)),
            capture_output=True, text=True, timeout=300,
            env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert run.returncode != 0
    assert "L=2 local ranks" in run.stdout + run.stderr
    assert "S=1 shard" in run.stdout + run.stderr


def test_a_zero_redundancy_inner_optimizer_trains_as_its_optimizer_alone(tmp_path):
    # The same SGD inside a ZeroRedundancyOptimizer (each rank steps its
    # partition, then broadcasts it) ends bit for bit where SGD on every
    # rank ends; its state_dict is consolidated for every rank's own state.
    with co2.local_aggregator(num_shards=2) as agg:
        plain = _run_job(tmp_path, agg, "plain", "default")
        zero = _run_job(tmp_path, agg, "zero", "default", ["--inner", "zero", "--check_state"])
    assert [r["rank_slices"] for r in zero] == [True] * 4
    assert {r["params"] for r in zero} == {plain[0]["params"]}
    assert all(r["checks"]["anchor_same_on_every_rank"] for r in zero)


def test_a_zero_redundancy_optimizer_with_bucket_views_is_refused(tmp_path):
    import torch
    import torch.distributed as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0,
                            world_size=1)
    try:
        model = torch.nn.Linear(4, 2)
        inner = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD,
                                        lr=0.1, parameters_as_bucket_view=True)
        with pytest.raises(ValueError, match="parameters_as_bucket_view=False"):
            co2.Optimizer(model.parameters(), inner, tau=2, rounds=1,
                          aggregators=["127.0.0.1:1"], job="zero-buckets")
    finally:
        dist.destroy_process_group()
