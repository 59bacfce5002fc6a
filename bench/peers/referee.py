"""The referee's campaign of bench/peers (issue 63): its cells, topologies,
tuning budget, frozen settings, run order and cost. Pure: run.py runs the
rows this builds, summarize.py reads them.

  select    each system's settings of budget.json, seed 1, unshaped link
            (no rate limit, no delay), same-hardware topology; `pick`
            freezes one setting per system into peers_frozen.json;
  headline  seeds 2-6, 100 Mbit/s and 1 Gbit/s per worker at 50 ms RTT,
            every system at its frozen setting, plus DDP on the unshaped
            link per seed (its final loss and time set the targets);
  loss      100 Mbit/s at 100 ms RTT and 0.1 % loss, seeds 2-4, reported
            apart.

Topologies: "service" puts co2's shards (and torchft's lighthouse,
hivemind's first peer) on a host of their own behind a link of the cell's
kind at WORKERS x a worker's rate; "same" runs S = WORKERS shards, shard i
in worker i's namespace behind worker i's link (the lighthouse and the DHT
bootstrap in worker 0's). DDP has no service: its rows run once per cell,
named "same". The peers' data path (all-reduce between workers) does not
cross the service host, so by default they run in "same" only and are the
comparison for co2's rows of both topologies (PEER_TOPOLOGIES: both runs
them in both).
"""

from __future__ import annotations

import json
import math
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
BUDGET = os.path.join(HERE, "budget.json")
FROZEN = os.path.join(ROOT, "bench", "results", "peers_frozen.json")
TIMINGS = os.path.join(ROOT, "bench", "results", "peers.json")

SYSTEMS = ("ddp", "torchft-diloco", "torchft-streaming", "torchft-localsgd", "hivemind", "co2")
WORKERS = 4
SIZE, STEPS, EVAL_EVERY = "small", 1024, 128
SELECT_SEED = 1
HEADLINE_SEEDS = (2, 3, 4, 5, 6)
LOSS_SEEDS = (2, 3, 4)
# (rate, RTT ms, loss fraction); "none" is the unshaped link.
UNSHAPED = ("none", 0, 0.0)
HEADLINE_CELLS = (("100mbit", 50, 0.0), ("1gbit", 50, 0.0))
LOSS_CELL = ("100mbit", 100, 0.001)
# The loss cell, reported apart, runs co2 against the peers that lead it
# elsewhere; hivemind and streaming DiLoCo stay in the headline cells.
LOSS_SYSTEMS = ("ddp", "torchft-diloco", "torchft-localsgd", "co2")
TOPOLOGIES = ("service", "same")
PEER_TOPOLOGIES = ("same",)
# A run may stop once it passes the largest wall budget (2 x DDP's
# unshaped time): rows whose estimate runs past it get fewer steps, with
# this margin over the estimate.
CUT_MARGIN = 1.3
LARGEST_BUDGET = 2.0


def load_budget(path: str = BUDGET) -> dict:
    """budget.json, checked: at most 6 settings per system, unique names."""
    with open(path) as f:
        budget = json.load(f)
    for system, entry in budget["systems"].items():
        names = [s["name"] for s in entry["settings"]]
        if len(names) > 6 or len(set(names)) != len(names):
            raise ValueError(f"{path}: {system} has {len(names)} settings {names} (at most 6, unique)")
    return budget


def cell_name(rate: str, rtt_ms: float, loss: float) -> str:
    """small-100mbit-50ms's middle: "100mbit-50ms", "100mbit-100ms-loss0.1%", "none"."""
    if rate == "none" and not rtt_ms and not loss:
        return "none"
    out = f"{rate}-{rtt_ms:g}ms"
    return out + (f"-loss{loss * 100:g}%" if loss else "")


def row_name(r: dict) -> str:
    tau = "" if r["system"] == "ddp" else f"-tau{r['tau']}"
    head = f"{r['size']}-{cell_name(r['link'], r['rtt_ms'], r['loss'])}{tau}-seed{r['seed']}"
    if r["phase"] == "select":
        return f"select-{head}-{r['system']}-{r['setting']}"
    return f"{head}-{r['topology']}-{r['system']}"


def make_row(system: str, setting: dict, *, phase: str, cell: tuple, seed: int, topology: str,
             size: str = SIZE, steps: int = STEPS, tau: int = 16,
             eval_every: int = EVAL_EVERY, val_windows: int = 0) -> dict:
    """One run of the referee grid: its settings are its cache key."""
    rate, rtt_ms, loss = cell
    knobs = {k: setting[k] for k in ("outer_lr", "outer_momentum", "fragments",
                                     "fragment_sync_delay") if k in setting}
    r = dict(referee=True, phase=phase, system=system, setting=setting["name"],
             variant=setting.get("variant", system), size=size, steps=steps,
             full_steps=steps, tau=setting.get("tau", tau), lr=setting["lr"], seed=seed,
             link=rate, rtt_ms=rtt_ms, loss=loss, topology=topology, eval_every=eval_every,
             val_windows=val_windows, **knobs)
    if system == "co2":
        r["co2_apply"] = "arrival"
        r["snapshot"] = "applied"
    return r


def select_rows(budget: dict, **kw) -> list:
    """Every setting of the budget, seed 1, unshaped, same-hardware; the
    pick reads the final loss only (one evaluation, at the end)."""
    steps = kw.get("steps", STEPS)
    return [make_row(system, s, phase="select", cell=UNSHAPED, seed=SELECT_SEED,
                     topology="same", eval_every=steps, **kw)
            for system in SYSTEMS for s in budget["systems"][system]["settings"]]


def pick(budget: dict, losses: dict) -> dict:
    """Each system's setting by budget["rule"]: losses[system][setting] is a
    final loss, or None / inf for a failed or diverged run. A system with no
    finite loss picks nothing (None)."""
    out = {}
    for system, entry in budget["systems"].items():
        ran = [(s["name"], losses.get(system, {}).get(s["name"])) for s in entry["settings"]]
        finite = [(n, v) for n, v in ran if v is not None and math.isfinite(v)]
        if not finite:
            out[system] = None
            continue
        low = min(v for _, v in finite)
        out[system] = next(n for n, v in finite if v <= low + budget["tie_nats"])
    return out


def frozen_settings(budget: dict, frozen: dict) -> dict:
    """system -> its frozen setting (budget.json's entry), checked against
    the budget: a frozen name the budget does not list is refused."""
    out = {}
    for system in SYSTEMS:
        name = frozen["picked"].get(system)
        settings = {s["name"]: s for s in budget["systems"][system]["settings"]}
        if name not in settings:
            raise ValueError(f"peers_frozen.json picks {name!r} for {system}, "
                             f"not one of budget.json's {sorted(settings)}")
        out[system] = settings[name]
    return out


def order(seed: int, systems=SYSTEMS) -> list:
    """The systems' run order for a seed: shuffled by the seed, recorded."""
    out = list(systems)
    random.Random(1000 + seed).shuffle(out)
    return out


def phase_rows(settings: dict, phase: str, cells: tuple, seeds: tuple,
               topologies: tuple = TOPOLOGIES, peer_topologies: tuple = PEER_TOPOLOGIES,
               systems: tuple = SYSTEMS, **kw) -> list:
    """The headline or loss-cell rows: per seed (interleaved: all cells and
    systems of one seed before the next), DDP on the unshaped link, then
    per cell every system in the seed's order, co2 in each topology."""
    rows = []
    for seed in seeds:
        rows.append(make_row("ddp", settings["ddp"], phase=phase, cell=UNSHAPED, seed=seed,
                             topology="same", **kw))
        for cell in cells:
            for system in order(seed, systems):
                tops = (topologies if system == "co2" else
                        ("same",) if system == "ddp" else peer_topologies)
                rows += [make_row(system, settings[system], phase=phase, cell=cell, seed=seed,
                                  topology=t, **kw) for t in tops]
    return rows


# -- cost --------------------------------------------------------------------

# What a run costs beyond its training loop: start-up and shutdown (the
# cached records' elapsed - wall at 256 steps, 25-30 s), and evaluating
# worker 0's copies on the full validation split (3,963 windows; 32 s per
# evaluation of the 3.3M model on one loaded core, measured; worker.py
# evaluates on every core once training is over, so half that).
RUN_OVERHEAD_S = 30
EVAL_S = {"tiny": 1.0, "small": 16.0, "medium": 120.0}
LINK_SETUP_S = 12  # ov_link's self-check: 20 pings and iperf3 for 2 + 6 s
# Round trips a system waits per round (per step for DDP) on top of the
# unshaped link's step time: a blocking all-reduce of buckets (DDP: per
# step), torchft's quorum and all-reduce, hivemind's matchmaking round;
# co2 overlaps its exchange and waits for none.
RTTS_PER_ROUND = {"ddp": 4, "torchft-diloco": 4, "torchft-streaming": 4,
                  "torchft-localsgd": 4, "hivemind": 6, "co2": 0}


def cached_step_s(path: str = TIMINGS) -> dict:
    """(system, rate) -> seconds per step of the small model, from the
    cached records of bench/results/peers.json (256 steps, seed 1, tau 16;
    the median over repeats)."""
    with open(path) as f:
        doc = json.load(f)
    per = {}
    for r in doc["rows"]:
        if "wall_s" not in r or r["size"] != "small" or r["seed"] != 1:
            continue
        if r["system"] != "ddp" and r["tau"] != 16:
            continue
        per.setdefault((r["system"], r["link"]), []).append(r["wall_s"] / r["steps"])
    return {k: sorted(v)[len(v) // 2] for k, v in per.items()}


def estimate_s(r: dict, step_s: dict) -> float:
    """A run's estimated seconds on this machine, start to finish."""
    system = r["system"]
    per = step_s.get((system, r["link"])) or step_s.get((system, "none"), 0.35)
    if r["size"] == "tiny":
        per = 0.02 + (4 * 135_168 * 3 / 4 / 12.5e6 if system == "ddp" and r["link"] == "100mbit"
                      else 0.0)
    rounds = r["steps"] if system == "ddp" else r["steps"] // r["tau"]
    train = r["steps"] * per + rounds * RTTS_PER_ROUND[system] * r["rtt_ms"] / 1e3
    evals = math.ceil(r["steps"] / r["eval_every"])
    return train + RUN_OVERHEAD_S + evals * EVAL_S[r["size"]]


def cut_steps(rows: list, step_s: dict) -> None:
    """Gives a row whose estimated training runs well past the largest
    wall budget (LARGEST_BUDGET x DDP's unshaped time) fewer steps, a
    multiple of its eval_every and its tau: it may stop there."""
    ddp = {r["seed"]: r for r in rows if r["system"] == "ddp" and r["link"] == "none"}
    for r in rows:
        ref = ddp.get(r["seed"])
        if ref is None or r is ref:
            continue
        per = (estimate_s(r, step_s) - RUN_OVERHEAD_S) / r["steps"]
        ref_train = ref["steps"] * step_s.get(("ddp", "none"), 0.33)
        need = math.ceil(CUT_MARGIN * LARGEST_BUDGET * ref_train / per)
        unit = max(r["eval_every"], r["tau"])
        need = math.ceil(need / unit) * unit
        if need < r["steps"]:
            r["steps"] = need


def plan(rows: list, step_s: dict) -> dict:
    """Every run with its estimate, the link set-ups, and the total."""
    runs = [{"name": row_name(r), "phase": r["phase"], "steps": r["steps"],
             "estimate_s": estimate_s(r, step_s)} for r in rows]
    cells = {(r["link"], r["rtt_ms"], r["loss"]) for r in rows}
    setups = len(cells) * (1 + len({r["seed"] for r in rows}))
    total = sum(x["estimate_s"] for x in runs) + setups * LINK_SETUP_S
    by_phase = {}
    for x in runs:
        by_phase[x["phase"]] = by_phase.get(x["phase"], 0) + x["estimate_s"]
    return {"runs": runs, "link_setups": setups, "by_phase_s": by_phase, "total_s": total}
