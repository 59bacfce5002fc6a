"""Several processes per node under torchrun (Gloo)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import co2

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.parametrize("apply,by_step", [("boundary", 0), ("arrival", 0), ("arrival", 1)])
def test_a_node_of_two_ranks_averages_gradients_and_shares_the_anchor(tmp_path, apply, by_step):
    # With apply="arrival" the leader's decision reaches both ranks at the
    # same step: the ranks stay identical after every step. With by_step 1
    # the leader waits for each update after a round's first step while the
    # other rank waits for its decision.
    # torch's own module, not the `torchrun` script (which an install may
    # lack): torch is all this needs.
    with co2.local_aggregator(num_shards=1) as agg:
        run = subprocess.run(
            # --redirects/--tee 1: torch 1.13's default "0" parses to None
            # on Python 3.11 (a zero-valued Flag is not iterated there).
            [sys.executable, "-m", "torch.distributed.run", "--standalone",
             "--nproc_per_node=2", "--redirects", "1", "--tee", "1",
             "--log_dir", str(tmp_path), os.path.join(HERE, "node_worker.py"),
             "--aggregators", ",".join(agg.addresses), "--job", "node", "--apply", apply,
             "--apply_by_step", str(by_step)],
            capture_output=True, text=True, timeout=300,
            env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert run.returncode == 0, run.stderr[-4000:]
    # Teed lines read "[<role><rank>]:<line>".
    [line] = [l[l.index("{"):] for l in run.stdout.splitlines() if "{" in l]
    r = json.loads(line)
    assert r["leader"]
    # Gradients averaged over the node: both ranks step the same way.
    assert r["same_every_step"]
    assert r["same_at_end"]
    assert (r["round"], r["anchor_round"]) == (4, 5)
    assert r["bytes_sent"] > 0
    assert len(r["applied_after_steps"]) == (4 if apply == "arrival" else 0)
    if by_step:
        assert r["applied_after_steps"] == [0, 1, 1, 1]
