"""The referee's arithmetic (stats.py) and campaign (referee.py): targets
read off curves, the paired t interval and its word, the pick and the
freeze, the run order, the rows' names and keys, the plan, and the refusal
of rows from mixed commits (ctest peers_referee_test; the runs themselves
are what run.py --referee smoke exercises)."""

import math
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import referee  # noqa: E402
import run  # noqa: E402
import stats  # noqa: E402
import summarize  # noqa: E402

CURVE = [{"samples": 100, "wall_s": 10.0, "val_loss": 3.0},
         {"samples": 200, "wall_s": 20.0, "val_loss": 2.6},
         {"samples": 300, "wall_s": 30.0, "val_loss": 2.5}]


def test_time_to_a_target_interpolates_between_evaluations():
    assert stats.time_to(CURVE, 2.8) == pytest.approx(15.0)
    assert stats.time_to(CURVE, 3.5) == 10.0
    assert stats.time_to(CURVE, 2.4) is None


def test_targets_are_ddps_final_loss_plus_each_margin():
    m = stats.targets(CURVE, ddp_final=2.5, ddp_unshaped_s=20.0, equal_samples=250)
    # 2.5 * 1.02 = 2.55: halfway from 2.6 (20 s) to 2.5 (30 s).
    assert m["time_to_ddp+2%"] == pytest.approx(25.0)
    assert m["time_to_ddp+1%"] == pytest.approx(27.5)
    assert m["time_to_ddp+0.5%"] == pytest.approx(28.75)
    # Budgets 10, 20, 40 s: the last model evaluated by then; past the end the final one.
    assert (m["loss_at_0.5x_ddp_time"], m["loss_at_1x_ddp_time"],
            m["loss_at_2x_ddp_time"]) == (3.0, 2.6, 2.5)
    assert m["loss_at_equal_samples"] == 2.6
    assert set(m) == set(stats.METRICS)


def test_a_run_cut_short_has_no_loss_at_a_budget_past_its_end():
    assert stats.loss_at_budget(CURVE, 40.0, complete=False) is None
    assert stats.loss_at_budget(CURVE, 25.0, complete=False) == 2.6
    assert stats.loss_at_budget(CURVE, 5.0) is None


def test_t_interval_matches_the_closed_form():
    # differences -1, -2, -3, -4, -5: mean -3, sd sqrt(2.5), t(0.975, 4) = 2.776.
    co2 = {s: 10.0 - s for s in range(1, 6)}
    peer = {s: 10.0 for s in range(1, 6)}
    c = stats.paired(co2, peer)
    half = 2.776 * math.sqrt(2.5) / math.sqrt(5)
    assert c["interval"] == pytest.approx((-3 - half, -3 + half))
    assert c["median_difference"] == -3
    assert c["word"] == "ahead"
    assert c["method"].startswith("paired t, n = 5")


def test_an_interval_holding_zero_is_a_tie_even_when_the_median_favours_co2():
    # differences -0.3, -0.2, -0.1, +0.1, +0.4: median -0.1, mean -0.02,
    # sd 0.277: the interval [-0.36, +0.32] holds 0.
    diffs = [-0.3, -0.2, -0.1, 0.1, 0.4]
    c = stats.paired({s: 2.0 + d for s, d in enumerate(diffs)}, {s: 2.0 for s in range(5)})
    assert c["interval"][0] < 0 < c["interval"][1]
    assert c["interval"] == pytest.approx((-0.02 - 2.776 * 0.2774887 / math.sqrt(5),
                                           -0.02 + 2.776 * 0.2774887 / math.sqrt(5)), abs=1e-4)
    assert c["word"] == "tie"


def test_a_consistent_small_lead_is_ahead_and_its_mirror_behind():
    # mean -0.045, sd 0.0287228 (n - 1), t = -3.50: the interval ends at -0.00934.
    diffs = [-0.08, -0.05, -0.03, -0.06, -0.005]
    c = stats.paired({s: 1.0 + d for s, d in enumerate(diffs)}, {s: 1.0 for s in range(5)})
    lo, hi = c["interval"]
    assert hi == pytest.approx(-0.045 + 2.776 * 0.0287228132 / math.sqrt(5), abs=1e-8)
    assert hi < 0 and c["word"] == "ahead"
    c = stats.paired({s: 1.0 for s in range(5)}, {s: 1.0 + d for s, d in enumerate(diffs)})
    assert c["word"] == "behind"


def test_an_interval_that_just_holds_zero_is_a_tie():
    """mean -0.019, sd 0.0174642, t = -2.43: t(0.975, 4) = 2.776 gives
    [-0.0407, +0.0027], a tie; a normal interval (1.96) would end at
    -0.0037 and call it ahead, as would the sd without Bessel's correction
    (ending at +0.0004 only with t; with 1.96, below 0)."""
    diffs = [-0.04, -0.03, -0.02, -0.01, 0.005]
    c = stats.paired({s: 1.0 + d for s, d in enumerate(diffs)}, {s: 1.0 for s in range(5)})
    assert c["interval"] == pytest.approx((-0.019 - 2.776 * 0.0174642492 / math.sqrt(5),
                                           -0.019 + 2.776 * 0.0174642492 / math.sqrt(5)),
                                          abs=1e-8)
    assert c["word"] == "tie"


def test_fewer_than_five_pairs_or_one_sided_targets_decide_nothing_but_a_clean_sweep():
    four = stats.paired({s: 1.0 for s in range(4)}, {s: 2.0 for s in range(4)})
    assert four["interval"] is None and four["word"] == "undecided"
    only_co2 = stats.paired({s: 10.0 for s in range(5)}, {s: None for s in range(5)})
    assert only_co2["word"] == "ahead" and only_co2["method"].startswith("sign")
    mixed = stats.paired({s: 10.0 for s in range(5)}, {0: None, 1: 9, 2: 9, 3: 9, 4: 9})
    assert mixed["word"] == "undecided" and mixed["only_co2"] == [0]


def test_pick_takes_the_lowest_and_the_first_listed_within_the_tie():
    budget = {"tie_nats": 0.0005, "systems": {"co2": {"settings": [
        {"name": "a"}, {"name": "b"}, {"name": "c"}]}, "ddp": {"settings": [{"name": "x"}]}}}
    assert referee.pick(budget, {"co2": {"a": 2.6, "b": 2.5, "c": 2.4998},
                                 "ddp": {"x": math.inf}}) == {"co2": "b", "ddp": None}
    assert referee.pick(budget, {"co2": {"a": None, "b": 2.7, "c": 2.5}})["co2"] == "c"


def test_the_budget_is_at_most_six_settings_per_system_and_frozen_names_are_its_own():
    budget = referee.load_budget()
    assert set(budget["systems"]) == set(referee.SYSTEMS)
    for entry in budget["systems"].values():
        assert 1 <= len(entry["settings"]) <= 6
    frames = budget["systems"]["torchft-streaming"]["settings"]
    for s in frames:  # torchft: delay < tau / fragments
        assert s["fragment_sync_delay"] < budget["tau"] // s["fragments"]
    with pytest.raises(ValueError, match="not one of"):
        referee.frozen_settings(budget, {"picked": dict.fromkeys(referee.SYSTEMS, "nope")})


def test_headline_rows_run_every_system_at_its_frozen_setting_in_every_cell():
    budget = referee.load_budget()
    frozen = {x: budget["systems"][x]["settings"][-1] for x in referee.SYSTEMS}
    rows = referee.phase_rows(frozen, "headline", referee.HEADLINE_CELLS, referee.HEADLINE_SEEDS)
    for r in rows:
        assert r["setting"] == frozen[r["system"]]["name"]
    names = [referee.row_name(r) for r in rows]
    assert len(set(names)) == len(names)
    assert "small-100mbit-50ms-tau16-seed2-service-co2" in names
    assert "small-1gbit-50ms-tau16-seed6-same-co2" in names
    assert "small-none-seed3-same-ddp" in names
    # Interleaved: every row of a seed before the next seed's; the order is the seed's.
    seeds = [r["seed"] for r in rows]
    assert seeds == sorted(seeds)
    cell = [r["system"] for r in rows if r["seed"] == 4 and r["link"] == "1gbit"
            and r["topology"] == "same"]
    assert cell == [x for x in referee.order(4) if x != "co2"] or \
        [x for x in cell] == [x for x in referee.order(4)]
    assert referee.order(2) != referee.order(3) and sorted(referee.order(2)) == sorted(referee.SYSTEMS)


def test_rtt_loss_and_topology_are_in_the_name_and_the_cache_key():
    budget = referee.load_budget()
    s = budget["systems"]["co2"]["settings"][0]
    a = referee.make_row("co2", s, phase="headline", cell=("100mbit", 50, 0.0), seed=2,
                         topology="same")
    b = dict(a, rtt_ms=100, loss=0.001)
    c = dict(a, topology="service")
    assert referee.row_name(b) == "small-100mbit-100ms-loss0.1%-tau16-seed2-same-co2"
    assert len({run.cache_key(x) for x in (a, b, c)}) == 3


def test_the_plan_lists_every_run_and_sums_them():
    budget = referee.load_budget()
    frozen = {x: budget["systems"][x]["settings"][0] for x in referee.SYSTEMS}
    rows = referee.select_rows(budget) + referee.phase_rows(
        frozen, "headline", referee.HEADLINE_CELLS, referee.HEADLINE_SEEDS)
    step_s = {("ddp", "none"): 0.3, ("ddp", "100mbit"): 2.0}
    referee.cut_steps(rows, step_s)
    p = referee.plan(rows, step_s)
    assert len(p["runs"]) == len(rows)
    assert p["total_s"] == pytest.approx(sum(x["estimate_s"] for x in p["runs"])
                                         + p["link_setups"] * referee.LINK_SETUP_S)
    # DDP behind 100 Mbit/s would run far past 2 x its unshaped time: it stops there.
    cut = [r for r in rows if r["system"] == "ddp" and r["link"] == "100mbit"]
    assert cut and all(r["steps"] < r["full_steps"] and r["steps"] % 128 == 0 for r in cut)


def test_rows_from_mixed_commits_are_refused_by_name():
    def rec(name, commit):
        return {"run": {"phase": "headline"}, "commit": commit, "ranks": []}
    records = {"a": rec("a", "c1"), "b": rec("b", "c2"), "c": rec("c", "c1")}
    assert summarize.mixed_commits(records) == {"c1": ["a", "c"], "c2": ["b"]}
    assert summarize.mixed_commits({"a": rec("a", "c1")}) == {}


def test_the_cell_table_pairs_co2_with_each_peer_by_seed():
    def row(system, seed, topology, loss):
        metrics = dict.fromkeys(stats.METRICS, loss)
        return {"name": f"{system}{seed}{topology}", "phase": "headline", "system": system,
                "link": "1gbit", "rtt_ms": 50, "loss": 0.0, "topology": topology,
                "seed": seed, "metrics": metrics, "wire_bytes_per_worker": 1e6,
                "wire_bytes_all_links": 5e6}
    rows = [row("co2", s, t, 2.50 - 0.01 * s) for s in range(2, 7) for t in ("service", "same")]
    rows += [row("torchft-localsgd", s, "same", 2.55) for s in range(2, 7)]
    cells = summarize.referee_cells(rows)
    assert [c["topology"] for c in cells] == ["service", "same"]
    for c in cells:
        assert c["systems"]["torchft-localsgd"]["topology"] == "same"
        cmp = c["co2_against"]["torchft-localsgd"]["loss_at_equal_samples"]
        assert cmp["seeds"] == [2, 3, 4, 5, 6] and cmp["word"] == "ahead"
