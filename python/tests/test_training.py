"""Training jobs: Python workers, alone and with a C++ co2-train worker."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest
import torch

import co2
from conftest import binary, results, start_worker, wait_for_line, wait_for_live_workers


def workers(agg, job, n, *extra):
    return [start_worker(["--aggregators", ",".join(agg.addresses), "--job", job,
                          "--worker", str(i), "--workers", str(n), *extra])
            for i in range(n)]


def test_two_workers_learn_and_end_on_the_shards_anchor():
    with co2.local_aggregator(num_shards=2) as agg:
        out = _run_together(agg, "two", 2, "--rounds", "20", "--tau", "4")
    for r in out:
        assert "error" not in r, r
        first, last = sum(r["losses"][:8]) / 8, sum(r["losses"][-8:]) / 8
        assert last < 0.8 * first, (first, last)
        assert r["stats"]["round"] == 20
        assert r["anchor_round"] == 21  # the last round's update applied
        assert r["stats"]["bytes_sent"] > 0 and r["stats"]["bytes_received"] > 0
    # verify_final_anchor checked each worker against the shards bit for bit.
    assert out[0]["digest"] == out[1]["digest"]


@pytest.mark.parametrize("extra,by_step", [(["--eager_share", "0.5"], 0),
                                           (["--apply_by_step", "1"], 1)])
def test_workers_applying_on_arrival_end_on_the_shards_anchor(extra, by_step):
    # With apply_by_step=1 each update is applied after its round's first
    # step, waited for there when it is not back yet.
    with co2.local_aggregator(num_shards=2) as agg:
        out = _run_together(agg, f"arrival-by{by_step}", 2, "--rounds", "20", "--tau", "8",
                            "--apply", "arrival", *extra)
    for r in out:
        assert "error" not in r, r
        first, last = sum(r["losses"][:8]) / 8, sum(r["losses"][-8:]) / 8
        assert last < 0.8 * first, (first, last)
        assert r["anchor_round"] == 21
        applied = r["stats"]["applied_after_steps"]
        assert len(applied) == 20
        if by_step:
            assert applied == [0] + [by_step] * 19
    # verify_final_anchor checked each worker against the shards bit for bit.
    assert out[0]["digest"] == out[1]["digest"]


def _arrival_job(agg, job, lr, **kw):
    """A small MLP whose co2.Optimizer (SGD at lr, 5 rounds of 4 steps)
    applies on arrival; with its data."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    inner = torch.optim.SGD(model.parameters(), lr=lr)
    opt = co2.Optimizer(model.parameters(), inner, tau=4, rounds=5, aggregators=agg.addresses,
                        job=job, apply="arrival", **kw)
    return model, opt, torch.randn(64, 8), torch.randn(64, 1)


def test_an_update_that_arrived_is_applied_after_the_next_step():
    lr = 0.05
    with co2.local_aggregator() as agg:
        # Without carried progress the round starts at the anchor (the
        # apply with it is the next test's).
        model, opt, x, y = _arrival_job(agg, "mid-round", lr, carry_progress=False)
        flat = lambda ts: torch.cat([t.detach().reshape(-1) for t in ts])  # noqa: E731
        for step in range(20):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            first_of_round = step % 4 == 0 and step > 0
            if first_of_round:
                # The update this round owes is here before its first step,
                # which then applies it on top of that step's progress.
                opt._exchange.await_update(opt.round - 1)
                before = flat(model.parameters())
                anchor = torch.empty_like(before)
                opt._exchange.copy_anchor(anchor.data_ptr(), anchor.numel())
            opt.step()
            if first_of_round:
                grad = flat(p.grad for p in model.parameters())
                new_anchor = torch.empty_like(before)
                opt._exchange.copy_anchor(new_anchor.data_ptr(), new_anchor.numel())
                assert (new_anchor - anchor).abs().max() > 1e-4, "no update was applied"
                assert opt.anchor_round == opt.round + 1, "anchor_round missed the update"
                kept = ((before - lr * grad) - anchor) + new_anchor
                assert torch.allclose(flat(model.parameters()), kept, rtol=0, atol=1e-6), \
                    "the step's progress was not kept on the new anchor"
        opt.finish()
        assert opt.stats()["applied_after_steps"] == [0, 1, 1, 1, 1]


def test_carried_progress_stands_in_for_the_mean_until_it_arrives():
    lr, alpha = 0.05, 0.5
    with co2.local_aggregator() as agg:
        model, opt, x, y = _arrival_job(agg, "carry", lr, config=co2.JobConfig(alpha=alpha),
                                        carry_progress=True)
        assert opt.anchor() is None  # not joined yet
        flat = lambda ts: torch.cat([t.detach().reshape(-1) for t in ts])  # noqa: E731
        start = None
        for step in range(20):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            grad = flat(p.grad for p in model.parameters())
            before = flat(model.parameters())
            if step % 4 == 0 and step > 0:
                # The round starts off the anchor, by the stand-in e; the update
                # is here before the round's first step, which drops e.
                opt._exchange.await_update(opt.round - 1)
                assert (before - opt.anchor()).abs().max() > 1e-4, "no stand-in was carried"
            opt.step()
            if step % 4 == 0:
                assert torch.allclose(flat(model.parameters()), opt.anchor() - lr * grad,
                                      rtol=0, atol=1e-6), "the stand-in was not dropped"
                start = opt.anchor()
            if step % 4 == 3:
                # x = A + e, e = −α·Δ: α of the way from the anchor to where
                # this worker's own round ended.
                end = before - lr * grad
                carried = opt.anchor() - alpha * (start - end)
                assert torch.allclose(flat(model.parameters()), carried, rtol=0, atol=1e-6), \
                    "the next round does not start from the worker's own step"
        opt.finish()
        assert torch.equal(opt.anchor(), flat(model.parameters()))
        assert opt.stats()["applied_after_steps"] == [0, 1, 1, 1, 1]


def _run_together(agg, job, n, *extra):
    """n workers of one job, all members before any round closes."""
    procs = workers(agg, job, n, "--wait_for_go", *extra)
    for p in procs:
        wait_for_line(p, '"joined"')
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    return results(procs)


def test_a_worker_that_leaves_is_waited_for_no_longer():
    # Worker 2 leaves after round 5 of 20: it ends on the anchor its round
    # 4 update made (its last Δ counted), and the others finish the job
    # without it (a round still waiting for it would time out).
    with co2.local_aggregator(num_shards=2) as agg:
        procs = [start_worker(["--aggregators", ",".join(agg.addresses), "--job", "shrink",
                               "--worker", str(i), "--workers", "3", "--rounds", "20",
                               "--tau", "4", "--update_timeout", "20", "--wait_for_go",
                               *(["--leave_after_rounds", "5"] if i == 2 else [])])
                 for i in range(3)]
        for p in procs:
            wait_for_line(p, '"joined"')
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        out = results(procs)
    for r in out:
        assert "error" not in r, r
    assert [r["left"] for r in out] == [False, False, True]
    assert out[2]["stats"]["round"] == 5 and out[2]["anchor_round"] == 6, out[2]
    assert out[0]["stats"]["round"] == 20 and out[0]["digest"] == out[1]["digest"]
    assert out[2]["digest"] != out[0]["digest"]


@pytest.mark.parametrize("codec,start", [("fp32", []), ("int8", []),
                                         ("fp32", ["--eager_share", "0.5"]),
                                         ("fp32", ["--carry_progress"])])
def test_a_job_stopped_at_round_10_and_resumed_ends_bit_identical(tmp_path, codec, start):
    # int8: the error-feedback residual is part of the saved state; with
    # eager updates, their offset and last delta are, with carried progress
    # the offset. At the boundary: the step an update is applied at on
    # arrival depends on when it arrives.
    common = ["--rounds", "20", "--tau", "4", "--uplink_codec", codec, *start,
              "--apply", "boundary"]
    with co2.local_aggregator(num_shards=2) as agg:
        whole = _run_together(agg, "whole", 2, *common)
    state = str(tmp_path / "w{worker}.pt")
    with co2.local_aggregator(num_shards=2) as agg:
        stopped = _run_together(agg, "resumed", 2, *common, "--stop_after_rounds", "10",
                                "--state", state)
        assert [r.get("stopped_at") for r in stopped] == [10, 10], stopped
        # Every worker process is gone; the shards kept the job.
        resumed = _run_together(agg, "resumed", 2, *common, "--resume", state)
    for r in whole + resumed:
        assert "error" not in r, r
    assert resumed[0]["digest"] == resumed[1]["digest"]
    assert resumed[0]["digest"] == whole[0]["digest"]


def test_localsgd_at_tau_1_is_the_inner_optimizer_alone():
    torch.manual_seed(0)
    x = torch.randn(64, 8)
    y = x @ torch.randn(8, 1)

    def train(wrap):
        torch.manual_seed(1)
        model = torch.nn.Linear(8, 1)
        inner = torch.optim.SGD(model.parameters(), lr=0.05)
        opt = wrap(model, inner) if wrap else inner
        for i in range(0, 64, 8):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x[i:i + 8]), y[i:i + 8]).backward()
            opt.step()
        stats = None
        if wrap:
            opt.finish()
            stats = dict(opt.stats(), anchor_round=opt.anchor_round)
        return torch.cat([p.detach().reshape(-1) for p in model.parameters()]), stats

    plain, _ = train(None)
    with co2.local_aggregator(num_shards=1) as agg:
        wrapped, stats = train(lambda model, inner: co2.Optimizer(
            model.parameters(), inner, tau=1, rounds=8, algo="localsgd",
            aggregators=agg.addresses, job="tau1"))
    # The 8 rounds happened through the shard: each step ended a round, sent
    # its delta (9 fp32 values) and took the round's update (no staleness:
    # round 7's is A_8).
    assert stats["round"] == 8 and stats["steps"] == 8, stats
    assert stats["anchor_round"] == 8, stats
    assert stats["bytes_sent"] >= 8 * 9 * 4, stats
    assert stats["bytes_received"] >= 8 * 9 * 4, stats
    # Not bit for bit: the worker sends Δ = A − x and gets back A − Δ, and
    # fp32 rounds A − x wherever A and x differ by more than a factor of 2
    # (Sterbenz), e.g. a weight that crosses zero: a few ulps.
    torch.testing.assert_close(wrapped, plain, rtol=1e-6, atol=1e-8)


def test_a_python_and_a_cpp_worker_end_bit_identical(tmp_path):
    train = binary("bin", "co2-train")
    checkpoint = binary("bin", "co2-checkpoint")
    rounds, tau, batch = 10, 4, 32
    shards_dir, run_dir = tmp_path / "shards", tmp_path / "run"
    shards_dir.mkdir()
    run_dir.mkdir()
    with co2.local_aggregator(num_shards=2, checkpoint_dir=str(shards_dir)) as agg:
        # co2-train runs as its own one-worker fleet (worker-0, all data);
        # the Python worker is worker-1 of a 2-way data split.
        py = start_worker(["--aggregators", ",".join(agg.addresses), "--job", "mixed",
                           "--worker", "1", "--workers", "2", "--rounds", str(rounds),
                           "--tau", str(tau), "--batch", str(batch), "--wait_for_go"])
        wait_for_line(py, '"joined"')
        cpp = subprocess.Popen(
            [train, "--role=worker", "--worker=0", "--workers=1", "--job=mixed",
             f"--aggregators={','.join(agg.addresses)}", f"--tau={tau}",
             f"--steps={rounds * tau}", f"--batch_size={batch}", "--threads=1",
             "--eval_every=0", f"--run_dir={run_dir}"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # Both are members before either pushes round 0, so every round
        # averages both.
        wait_for_live_workers(agg.addresses, "mixed", 2)
        py.stdin.write("go\n")
        py.stdin.flush()
        [r] = results([py])
        _, cpp_err = cpp.communicate(timeout=300)
    assert cpp.returncode == 0, cpp_err[-3000:]
    assert "error" not in r, r
    assert r["stats"]["round"] == rounds
    assert r["anchor_round"] == rounds + 1
    # The two final models, hashed the same way, are the same bits, and they
    # are the anchor in the shards' checkpoints.
    with open(run_dir / "rank-0-0.json") as f:
        cpp_report = json.load(f)
    assert r["fnv1a"] == cpp_report["final_hash"]
    shards = subprocess.run(
        [checkpoint, *(str(shards_dir / f"mixed.shard-{i}-of-2.ckpt") for i in range(2))],
        capture_output=True, text=True, timeout=60)
    assert shards.returncode == 0, shards.stderr[-2000:]
    last = dict(field.split("=", 1) for field in shards.stdout.splitlines()[-1].split())
    assert last["rounds_closed"] == str(rounds), last
    assert last["anchor_fnv1a"] == r["fnv1a"], (last, r["fnv1a"])


def test_a_worker_whose_shard_dies_gets_co2_error():
    with co2.local_aggregator(num_shards=2) as agg:
        procs = workers(agg, "dies", 1, "--rounds", "400", "--tau", "1",
                        "--update_timeout", "20")
        wait_for_line(procs[0], '"joined"')
        agg.kill(1)
        [r] = results(procs, timeout=200)
    assert "error_code" in r, r
    assert r["error_code"] in ("UNAVAILABLE", "DEADLINE_EXCEEDED", "ABORTED")


def test_a_worker_waiting_for_a_held_update_logs_the_shards_reason(tmp_path):
    with co2.local_aggregator(checkpoint_dir=str(tmp_path)) as agg:
        [p] = workers(agg, "held", 1, "--rounds", "100", "--tau", "1")
        wait_for_line(p, '"joined"')
        # A non-empty directory where the job's checkpoint goes: the shard
        # cannot rename its next checkpoint into place (EISDIR) and holds
        # the round's update. The shard may replace the file between the
        # unlink and the mkdir: then try again.
        path = tmp_path / "held.shard-0-of-1.ckpt"
        deadline = time.monotonic() + 30
        while True:
            path.unlink(missing_ok=True)
            try:
                path.mkdir()
                break
            except FileExistsError:
                assert time.monotonic() < deadline, "the checkpoint kept coming back"
        (path / "blocker").write_text("x")
        line = wait_for_line(p, "update held: checkpoint failing: Is a directory",
                             stream="stderr")
        assert "W" == line[0] and "shard 0 (127.0.0.1:" in line, line
        (path / "blocker").unlink()
        path.rmdir()
        [r] = results([p])
    assert "error" not in r, r
    assert r["stats"]["round"] == 100
