"""The referee's targets and statistics for bench/peers (summarize.py's
referee table; pure functions on curves and numbers, unit-tested by
referee_test.py).

A curve is worker 0's list of points {samples, wall_s, val_loss}, the last
the run's final model. Every metric here is lower-is-better:

  time to DDP + m     seconds until the validation loss first reaches DDP's
                      final loss (unshaped link, same seed) x (1 + m),
                      interpolated between evaluations; None if never;
  loss at budget B    the loss of the last model evaluated at or before wall
                      time B (what stopping at B leaves); a run that ended
                      before B has its final loss; None when the run was cut
                      short (fewer steps than the grid's) before B;
  loss at samples S   the loss of the last model evaluated at or before S
                      samples; S is the fewest samples any system of the cell
                      finished with, so every system is read at the same work.

co2 against a peer is the paired difference co2 - peer over the seeds both
ran, with a 95 % Student t interval on the differences (mean +- t(0.975,
n-1) * sd / sqrt(n)); "ahead" where the interval lies below 0, "behind"
where above, "tie" where it holds 0.
"""

from __future__ import annotations

import math
import statistics

TARGET_MARGINS = (0.005, 0.01, 0.02)
BUDGET_FACTORS = (0.5, 1.0, 2.0)
MIN_PAIRS = 5

# t(0.975, df) for df = 1..30; beyond 30 the normal's 1.96 is within 2 %.
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
        2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
        2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t975(df: int) -> float:
    """The two-sided 95 % critical value of Student's t with df degrees of freedom."""
    if df < 1:
        raise ValueError(f"a t interval needs df >= 1, got {df}")
    return T975[df - 1] if df <= len(T975) else 1.96


def time_to(curve: list, target: float):
    """Wall seconds until the curve first reaches `target` (linear between
    evaluations; the first evaluation's time if it already reaches it);
    None if it never does."""
    prev = None
    for p in curve:
        if p["val_loss"] <= target:
            if prev is None:
                return p["wall_s"]
            f = (prev["val_loss"] - target) / (prev["val_loss"] - p["val_loss"])
            return prev["wall_s"] + f * (p["wall_s"] - prev["wall_s"])
        prev = p
    return None


def loss_at_budget(curve: list, budget_s: float, complete: bool = True):
    """The loss of the last point evaluated at or before `budget_s`; a
    `complete` run (every step of its row done) that ended before the
    budget has its final loss, a cut-short one None."""
    if curve[-1]["wall_s"] <= budget_s:
        return curve[-1]["val_loss"] if complete else None
    before = [p for p in curve if p["wall_s"] <= budget_s]
    return before[-1]["val_loss"] if before else None


def loss_at_samples(curve: list, samples: int):
    """The loss of the last point at or before `samples` samples; None if
    the first evaluation came later."""
    before = [p for p in curve if p["samples"] <= samples]
    return before[-1]["val_loss"] if before else None


def targets(curve: list, ddp_final: float, ddp_unshaped_s: float, equal_samples: int,
            complete: bool = True) -> dict:
    """Every referee metric of one run, by name (see the module's doc)."""
    out = {}
    for m in TARGET_MARGINS:
        out[f"time_to_ddp+{m * 100:g}%"] = time_to(curve, ddp_final * (1 + m))
    for b in BUDGET_FACTORS:
        out[f"loss_at_{b:g}x_ddp_time"] = loss_at_budget(curve, b * ddp_unshaped_s, complete)
    out["loss_at_equal_samples"] = loss_at_samples(curve, equal_samples)
    return out


METRICS = tuple([f"time_to_ddp+{m * 100:g}%" for m in TARGET_MARGINS]
                + [f"loss_at_{b:g}x_ddp_time" for b in BUDGET_FACTORS]
                + ["loss_at_equal_samples"])


def paired(co2: dict, peer: dict) -> dict:
    """co2 against a peer on one metric: `co2` and `peer` map seed -> value
    (None: not reached / not defined). Returns the seeds paired, the paired
    differences co2 - peer, the interval, the method and the word.

    Only seeds where both have a value are differences. A seed where only
    co2 has a value counts for co2 and one where only the peer has one
    against it: when every seed is such a one-sided seed in the same
    direction, the word follows it (method "sign"); when some are, the t
    interval is not defined and the word is "undecided"."""
    seeds = sorted(set(co2) & set(peer))
    diffs = {s: co2[s] - peer[s] for s in seeds if co2[s] is not None and peer[s] is not None}
    only_co2 = [s for s in seeds if co2[s] is not None and peer[s] is None]
    only_peer = [s for s in seeds if co2[s] is None and peer[s] is not None]
    out = {"seeds": seeds, "differences": diffs, "only_co2": only_co2, "only_peer": only_peer,
           "median_difference": statistics.median(diffs.values()) if diffs else None,
           "interval": None, "method": None}
    if len(seeds) < MIN_PAIRS:
        out.update(method=f"none: {len(seeds)} seeds, fewer than {MIN_PAIRS}", word="undecided")
        return out
    if only_co2 or only_peer:
        if len(only_co2) == len(seeds) >= MIN_PAIRS:
            out.update(method="sign: only co2 reached it, every seed", word="ahead")
        elif len(only_peer) == len(seeds) >= MIN_PAIRS:
            out.update(method="sign: only the peer reached it, every seed", word="behind")
        else:
            out.update(method="none: reached by one side in some seeds only", word="undecided")
        return out
    n = len(diffs)
    if n < MIN_PAIRS:
        out.update(method=f"none: {n} pairs, fewer than {MIN_PAIRS}", word="undecided")
        return out
    vals = list(diffs.values())
    mean = statistics.mean(vals)
    half = t975(n - 1) * statistics.stdev(vals) / math.sqrt(n)
    out.update(interval=(mean - half, mean + half), mean_difference=mean,
               method=f"paired t, n = {n}, df = {n - 1}, t = {t975(n - 1)}")
    out["word"] = verdict(out["interval"])
    return out


def verdict(interval: tuple) -> str:
    """"ahead" (co2 lower) where the interval lies below 0, "behind" where
    above, "tie" where it holds 0."""
    lo, hi = interval
    if hi < 0:
        return "ahead"
    if lo > 0:
        return "behind"
    return "tie"
