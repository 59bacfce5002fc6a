"""bench/peers/run.py's shared inner-lr sweep: which lrs it runs and which it
picks, with a runner that answers from a table of final losses, and how a
run waits for its workers, with processes standing in for them (ctest
peers_sweep_test; the runs themselves are what the grid, peers_quick_test
and peers_interrupt_test exercise)."""

import json
import math
import os
import signal
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402
import seed  # noqa: E402
import summarize  # noqa: E402


class TableRunner:
    """Answers run(row) from losses[system][lr]: a float is a finished run,
    "error" a failed one, a missing lr (or None) a row it may not start. A
    row it is not to start (selected False) it answers from `cached` only."""

    def __init__(self, losses: dict, cached: dict = None) -> None:
        self.losses = losses
        self.cached = cached or {}
        self.ran = []

    def run(self, r: dict, selected: bool = True):
        if not selected:
            loss = self.cached.get(r["system"], {}).get(r["lr"])
            return None if loss is None else {"run": r, "ranks": [{"final_val_loss": loss}]}
        loss = self.losses.get(r["system"], {}).get(r["lr"])
        if loss is None:
            return None
        self.ran.append((r["system"], r["lr"]))
        if loss == "error":
            return {"run": r, "error": "worker 0 exited 1: diverged"}
        return {"run": r, "ranks": [{"final_val_loss": loss}]}


def sweep(runner, needed, size="small"):
    return run.sweep(runner, size, list(run.SYSTEMS), needed)


def test_best_inside_the_grid_runs_the_grid_only():
    assert run.SWEEP_LRS["small"] == (1e-3, 2e-3, 4e-3)
    runner = TableRunner({"ddp": {1e-3: 2.60, 2e-3: 2.55, 4e-3: 2.58}})
    out = sweep(runner, {"ddp"})
    assert out["ddp"]["best_lr"] == 2e-3
    assert runner.ran == [("ddp", 1e-3), ("ddp", 2e-3), ("ddp", 4e-3)]
    assert [x["final_val_loss"] for x in out["ddp"]["runs"]] == [2.60, 2.55, 2.58]


def test_a_best_on_an_edge_extends_the_grid_until_it_is_inside():
    losses = {"co2": {1e-3: 2.70, 2e-3: 2.65, 4e-3: 2.62, 8e-3: 2.60, 1.6e-2: 2.59,
                      3.2e-2: 2.61},
              "hivemind": {5e-4: 2.70, 1e-3: 2.66, 2e-3: 2.67, 4e-3: 2.68, 8e-3: 2.69}}
    out = sweep(TableRunner(losses), {"co2", "hivemind"})
    assert out["co2"]["best_lr"] == 1.6e-2
    assert [x["lr"] for x in out["co2"]["runs"]] == [1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2]
    assert out["hivemind"]["best_lr"] == 1e-3
    assert [x["lr"] for x in out["hivemind"]["runs"]] == [5e-4, 1e-3, 2e-3, 4e-3]


def test_the_bounds_stop_the_extension():
    losses = {"co2": {lr: 3.0 - lr for lr in (1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2, 6.4e-2)}}
    runner = TableRunner(losses)
    out = sweep(runner, {"co2"})
    assert out["co2"]["best_lr"] == run.SWEEP_BOUNDS[1] == 3.2e-2
    assert (("co2", 6.4e-2)) not in runner.ran


def test_a_failed_or_diverged_run_loses_and_is_reported():
    losses = {"co2": {5e-4: 2.66, 1e-3: 2.64, 2e-3: math.nan, 4e-3: "error"}}
    out = sweep(TableRunner(losses), {"co2"})
    assert out["co2"]["best_lr"] == 1e-3
    runs = {x["lr"]: x for x in out["co2"]["runs"]}
    assert "diverged" in runs[4e-3]["error"]
    assert math.isnan(runs[2e-3]["final_val_loss"])


def test_every_run_failing_picks_nothing():
    out = sweep(TableRunner({"co2": {lr: "error" for lr in run.SWEEP_LRS["small"]}}), {"co2"})
    assert out["co2"]["best_lr"] is None


def test_an_unfinished_sweep_picks_nothing():
    out = sweep(TableRunner({"ddp": {1e-3: 2.6, 2e-3: 2.5}}), {"ddp"})
    assert out["ddp"]["best_lr"] is None
    assert out["ddp"]["runs"][-1] == {"lr": 4e-3,
                                      "name": run.sweep_row("small", "ddp", 4e-3)["name"],
                                      "final_val_loss": None, "not_run": True}


def test_a_system_no_selected_row_needs_is_read_from_the_cache():
    """An invocation that runs co2's rows still writes every peer's rows:
    their sweeps come from the cache, and nothing of theirs is started."""
    runner = TableRunner({"co2": {1e-3: 2.60, 2e-3: 2.55, 4e-3: 2.58}},
                         cached={"ddp": {1e-3: 2.57, 2e-3: 2.56, 4e-3: 2.59}})
    out = sweep(runner, {"co2"})
    assert (out["co2"]["best_lr"], out["ddp"]["best_lr"]) == (2e-3, 2e-3)
    assert {system for system, _ in runner.ran} == {"co2"}
    assert out["hivemind"]["best_lr"] is None


def test_the_grid_row_at_the_best_lr_is_the_sweep_run():
    """Each size's row <size>-none-tau16-seed1-<system> at the chosen lr has
    that size's sweep run's settings, so the cache serves it without a
    second run; co2's rows add only how their curve is taken (the sweep
    reads the final loss alone)."""
    rows = run.grid(False)
    for size in run.SWEEP_AT:
        systems = run.sweep_systems(rows, size)
        assert "ddp" in systems and "co2" in systems, size
        for system in systems:
            row = next(r for r in rows if r["name"] == run.run_name(
                dict(run.SWEEP_AT[size], system=system)))
            row = dict(row, lr=4e-3)
            if system.startswith("co2"):
                assert row.pop("snapshot") == "applied", system
            assert run.cache_key(row) == run.cache_key(run.sweep_row(size, system, 4e-3)), system
            assert run.cache_key(row) != run.cache_key(run.sweep_row(size, system, 2e-3))


def test_each_size_sweeps_from_its_own_grid_and_its_rows_take_its_best():
    """The 25M model's rows take the lr its own sweep picks, not the small
    model's; its sweep starts at its own grid and runs only the systems it
    has rows for."""
    rows = run.grid(False)
    assert set(run.sweep_systems(rows, "medium")) == set(run.SYSTEMS) - set(run.CO2_HEADLINE_ONLY)
    losses = {"co2": {2.5e-4: 2.70, 5e-4: 2.60, 1e-3: 2.65}}
    runner = TableRunner(losses)
    out = run.sweep(runner, "medium", ["co2"], {"co2"})
    assert runner.ran == [("co2", 2.5e-4), ("co2", 5e-4), ("co2", 1e-3)]
    assert out["co2"]["best_lr"] == 5e-4
    assert {r["size"] for r in (run.sweep_row("medium", "co2", lr) for lr in losses["co2"])} \
        == {"medium"}
    small = run.sweep(TableRunner({"co2": {1e-3: 2.5, 2e-3: 2.4, 4e-3: 2.45}}), "small",
                      ["co2"], {"co2"})
    run.take_best(rows, {"small": small, "medium": out})
    lrs = {(r["size"], r["lr"]) for r in rows if r["system"] == "co2"}
    assert lrs == {("small", 2e-3), ("medium", 5e-4)}


def test_co2s_extra_settings_run_in_the_headline_rows_only():
    rows = run.grid(False)
    for system in run.CO2_HEADLINE_ONLY:
        names = {r["name"] for r in rows if r["system"] == system}
        assert names == {f"small-{link}-tau16-seed1-{system}"
                         for link in ("none", "100mbit", "1gbit")}
    for system in ("co2", "co2-a0.5", "co2-diloco", "co2-int8"):
        assert any(r["system"] == system and r["size"] == "medium" for r in rows), system
        assert any(r["system"] == system and r["tau"] == 64 for r in rows), system



def test_hivemind_waits_twice_an_all_reduce_where_that_outlasts_its_quickstart_timeout():
    """hivemind's docstring: averaging_timeout "around 2x the actual time it
    takes to run all-reduce". 1.5 x 102 MB each way at 12.5 MB/s is 12.2 s:
    the 25M model behind 100 Mbit/s waits 25 s; every other hivemind row,
    its sweep's included, runs at the quickstart's 10 s and 3 s of
    matchmaking, with no setting in its cache key."""
    rows = run.grid(False) + run.grid(True)
    rows += [run.sweep_row(size, s, 1e-3) for size in run.SWEEP_AT for s in run.SYSTEMS]
    for r in rows:
        r.setdefault("name", run.run_name(r))
    longer = {r["name"]: r["averaging_timeout"] for r in rows if "averaging_timeout" in r}
    assert longer == {"medium-100mbit-tau16-seed1-hivemind": 25,
                      "medium-100mbit-tau8-seed1-hivemind": 25}
    flags = {r["name"]: run.peer_args(r) for r in rows if run.peer_args(r)}
    assert {r["name"] for r in rows if r["system"] == "hivemind"} == set(flags)
    assert flags["medium-100mbit-tau8-seed1-hivemind"] == [
        "--matchmaking_time=3.0", "--averaging_timeout=25"]
    assert flags["small-none-tau16-seed1-hivemind-lr0.001"] == [
        "--matchmaking_time=3.0", "--averaging_timeout=10"]
    assert run.link_bytes_per_s("1gbit") == 125e6
    with pytest.raises(ValueError, match="not a shaped link: 'none'"):
        run.link_bytes_per_s("none")


def test_the_harness_knows_each_models_parameter_count():
    """run.PARAMS, which sizes hivemind's timeout, is task.py's models' count."""
    import task
    assert run.PARAMS == {size: task.count_parameters(task.make_model(shape, 1))
                          for size, shape in task.SIZES.items()}


def test_only_names_a_run_exactly_or_by_pattern():
    name = "small-100mbit-tau16-seed1-co2-a0.5"
    assert run.named(name, [name])
    assert not run.named(name, ["small-100mbit-tau16-seed1-co2"])
    assert run.named(name, ["small-none-*", "small-100mbit-tau16-*"])



def test_a_cached_repeat_is_its_grid_rows_settings(tmp_path):
    rows = run.grid(False)
    row = next(r for r in rows if r["name"] == "small-100mbit-tau16-seed1-co2")
    stale = dict(run.repeat_of(row, 2), snapshot="anchor")
    for i, r in enumerate((stale, dict(run.repeat_of(row, 3)))):
        (tmp_path / f"{i}.json").write_text(json.dumps({"run": r}))
    found = run.cached_repeats(rows, str(tmp_path))
    assert [x["name"] for x in found] == [
        "small-100mbit-tau16-seed1-co2-r2", "small-100mbit-tau16-seed1-co2-r3"]
    # The row the cache is asked for has the grid's settings, not the stale ones.
    assert found[0]["snapshot"] == "applied"
    assert run.cache_key(found[0]) != run.cache_key(stale)


def test_a_repeat_cached_at_an_lr_the_sweep_no_longer_picks_is_not_a_row(tmp_path):
    rows = run.grid(False)
    row = next(r for r in rows if r["name"] == "medium-100mbit-tau8-seed1-co2")
    for k, lr in ((2, 2.5e-4), (3, 5e-4)):
        x = dict(run.repeat_of(row, k), lr=lr)
        run.store(run.cache_path(str(tmp_path), x), {"run": x})
    repeats = run.cached_repeats(rows, str(tmp_path))
    assert [x["name"] for x in repeats] == [
        "medium-100mbit-tau8-seed1-co2-r2", "medium-100mbit-tau8-seed1-co2-r3"]
    rows += repeats
    run.take_best(rows, {"medium": {"co2": {"best_lr": 5e-4}}})
    kept = run.recorded_repeats(rows, repeats, [], str(tmp_path))
    names = {r["name"] for r in kept}
    assert "medium-100mbit-tau8-seed1-co2-r3" in names
    assert "medium-100mbit-tau8-seed1-co2-r2" not in names
    assert len(kept) == len(rows) - 1
    # --only naming the stale repeat runs it again at the sweep's lr.
    again = run.recorded_repeats(rows, repeats, ["*-co2-r2"], str(tmp_path))
    assert len(again) == len(rows)


def fake_record(r: dict, loss: float) -> dict:
    rank = {"train_s": 80.0, "params": 10, "final_val_loss": loss, "params_digest": "d",
            "optimizer_step_s": 8.0, "net_tx_bytes": 5, "net_rx_bytes": 6, "notes": {},
            "curve": [{"samples": 16 * k, "wall_s": 10.0 * k, "val_loss": loss + 1 / k}
                      for k in (1, 2)]}
    return {"run": r, "ranks": [rank] * 4, "commands": ["w0"], "elapsed_s": 90.0,
            "commit": "abc", "load_1min": [3.0, 4.0],
            "wire": {f"co2pr-w{i}": {"tx_bytes": 100, "rx_bytes": 200} for i in range(4)}}


def failed_record(r: dict) -> dict:
    return {"run": r, "error": "worker 2 ran past its 900 s limit: Unable to run All-Reduce",
            "commands": ["w0"], "elapsed_s": 930.0, "commit": "abc", "cpu": "A",
            "load_1min": [3.0, 4.0]}


def test_seeding_the_cache_from_results_gives_back_their_table(tmp_path):
    """A cache seeded from a results JSON serves every run of it under the
    settings the harness asks for, and the table built from it is the JSON's:
    a grid row (also the sweep's run at that lr), a co2 row, a repeat, a
    sweep-only run and a failed run (kept apart, with its error)."""
    rows = {r["name"]: r for r in run.grid(False)}
    ddp = dict(rows["small-none-seed1-ddp"], lr=5e-4)
    co2 = dict(rows["small-100mbit-tau16-seed1-co2"], lr=1e-3)
    picked = [dict(rows["small-local-seed1"]), ddp, co2, run.repeat_of(co2, 2)]
    records = {r["name"]: fake_record(dict(r), 2.5 + i / 10) for i, r in enumerate(picked)}
    failed = dict(rows["small-100mbit-tau16-seed1-hivemind"], lr=2.5e-4)
    records[failed["name"]] = failed_record(dict(failed))
    picked.append(failed)
    sweep_only = run.sweep_row("small", "ddp", 1e-3)
    records[sweep_only["name"]] = fake_record(sweep_only, 2.7)
    ddp_sweep = run.sweep_row("small", "ddp", 5e-4)
    records[ddp_sweep["name"]] = records[ddp["name"]]
    result = summarize.build(records, picked, [], command="c", versions={}, installed={},
                             machine={}, quick=False)
    result["lr_sweep"] = {"small": {"systems": {"ddp": {"best_lr": 5e-4, "runs": [
        {"lr": 5e-4}, {"lr": 1e-3}]}}}}
    path = tmp_path / "peers.json"
    path.write_text(json.dumps(result))
    cache = str(tmp_path / "cache")
    written, present = seed.seed(str(path), cache)
    assert sorted(written + present) == sorted(records)
    assert present == [ddp_sweep["name"]]  # the grid row's run, cached once
    got = {r["name"]: run.cached(cache, r, failed=r is failed)
           for r in picked + [sweep_only, ddp_sweep]}
    assert all(rec is not None for rec in got.values())
    assert run.cached(cache, failed) is None
    assert got[failed["name"]]["error"] == records[failed["name"]]["error"]
    assert got[sweep_only["name"]]["ranks"][0]["final_val_loss"] == 2.7
    table = [summarize.row_of(got[r["name"]], got) for r in picked]
    assert json.loads(json.dumps(table)) == result["rows"]
    assert seed.seed(str(path), cache)[0] == []


class Args:
    def __init__(self, cache: str) -> None:
        self.cache, self.max_minutes = cache, 0


def test_a_failed_run_is_kept_shown_and_run_again_when_selected(tmp_path, monkeypatch):
    """A run that fails is cached apart with its error and fails the
    invocation that ran it: one that does not select its row shows it as
    failed (not as not run) in the rows, the runs and docs/results/peers.md's
    table, without failing; one that selects it runs it again, and its
    success replaces the failure."""
    row = dict(next(r for r in run.grid(False)
                    if r["name"] == "medium-100mbit-tau16-seed1-hivemind"), lr=2.5e-4)
    outcome = {"rec": failed_record(dict(row))}
    monkeypatch.setattr(run, "one_run", lambda r, python, limit: dict(outcome["rec"], run=r))
    cache = str(tmp_path)

    def runner():
        x = run.Runner(Args(cache), "python", {"hivemind": {"status": "ok"}})
        x.current_link = row["link"]
        return x

    first = runner()
    first.run(dict(row))
    assert run.cached(cache, row) is None and first.failed == [row["name"]]
    later = runner()
    rec = later.run(dict(row), selected=False)
    assert rec["error"].startswith("worker 2 ran past its 900 s limit") and later.not_run == []
    # Not this invocation's failure: listed as an earlier one.
    assert later.failed == [] and later.failed_earlier == [row["name"]]
    result = summarize.build(later.records, [row], later.not_run, command="c", versions={},
                             installed={}, machine={}, quick=False)
    assert result["rows"][0]["error"] == rec["error"]
    assert result["runs"][row["name"]]["error"] == rec["error"]
    assert ("| medium | 100mbit | 16 | 1 | hivemind | 0.00025 | failed | "
            "worker 2 ran past its 900 s limit | | | | |") in summarize.markdown(result)
    outcome["rec"] = fake_record(dict(row), 2.69)
    runner().run(dict(row))
    assert run.cached(cache, row)["ranks"][0]["final_val_loss"] == 2.69
    assert run.cached(cache, row, failed=True) is None
    assert runner().run(dict(row), selected=False)["ranks"][0]["final_val_loss"] == 2.69


def test_throughput_is_against_the_no_communication_run_on_the_same_cpu():
    rows = {r["name"]: r for r in run.grid(False)}
    local, co2 = rows["small-local-seed1"], dict(rows["small-100mbit-tau16-seed1-co2"], lr=1e-3)
    records = {}
    for r, cpu, train_s in ((local, None, 40.0), (run.repeat_of(local, 2), "B", 20.0),
                            (run.repeat_of(local, 3), "A", 30.0), (co2, "A", 60.0),
                            (run.repeat_of(co2, 2), "A", 60.0),
                            (run.repeat_of(co2, 3), None, 60.0)):
        rec = fake_record(dict(r), 2.6)
        rec["ranks"] = [dict(x, train_s=train_s) for x in rec["ranks"]]
        rec["cpu"] = cpu
        records[r["name"]] = rec
    rows = [summarize.row_of(records[n], records) for n in (
        co2["name"], co2["name"] + "-r2", co2["name"] + "-r3")]
    # The same CPU's reference (r3's) serves both of A's repeats; a run of
    # unknown CPU (seeded from old results) keeps the first.
    assert [x["vs_local"] for x in rows] == [0.5, 0.5, 40.0 / 60.0]
    assert [x["cpu"] for x in rows] == ["A", "A", None]
    # Repeats on different CPUs are not one median.
    summary = summarize.repeats_summary(rows)
    assert [(e["cpu"], e["repeats"]) for e in summary] == [("A", 2), (None, 1)]


def test_a_row_without_a_reference_on_its_cpu_has_no_exposed_share():
    co2 = dict(next(r for r in run.grid(False) if r["name"] == "small-100mbit-tau16-seed1-co2"),
               lr=1e-3)
    rec = dict(fake_record(dict(co2), 2.6), cpu="A")
    result = summarize.build({co2["name"]: rec}, [co2], [], command="c", versions={},
                             installed={}, machine={}, quick=False)
    assert result["rows"][0].get("exposed_share") is None
    line = next(x for x in summarize.markdown(result).splitlines() if "| co2 |" in x)
    assert line.endswith("| 2.6000 | 80.0 | - | 0 |"), line


def test_seeding_refuses_a_run_the_grid_does_not_name(tmp_path):
    r = dict(run.SWEEP_AT["small"], system="ddp", lr=1e-3, name="small-none-seed1-nosuch")
    result = summarize.build({r["name"]: fake_record(r, 2.6)}, [r], [], command="c",
                             versions={}, installed={}, machine={}, quick=False)
    path = tmp_path / "peers.json"
    path.write_text(json.dumps(result))
    with pytest.raises(ValueError, match="small-none-seed1-nosuch"):
        seed.seed(str(path), str(tmp_path / "cache"))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


def _stand_ins(*commands: str) -> list:
    """Processes in sessions of their own, as run.py starts its workers."""
    return [subprocess.Popen(["sh", "-c", c], start_new_session=True) for c in commands]


def test_the_first_worker_to_fail_ends_the_run_and_the_others_are_killed(tmp_path):
    procs = _stand_ins("sleep 600", "sleep 0.2; exit 3", "sleep 600", "sleep 600")
    failed = run.wait_for_workers(procs, 60, str(tmp_path))
    assert len(failed) == 1 and failed[0].startswith("worker 1 exited 3"), failed
    assert all(p.poll() is not None for p in procs)


def test_a_stopped_run_kills_its_workers(tmp_path):
    procs = _stand_ins("sleep 600", "sleep 600")
    previous = signal.signal(signal.SIGALRM, run.stopped)
    signal.setitimer(signal.ITIMER_REAL, 0.3)
    try:
        with pytest.raises(SystemExit) as stop:
            run.wait_for_workers(procs, 60, str(tmp_path))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert stop.value.code == 143
    assert all(p.poll() is not None for p in procs), [p.poll() for p in procs]
