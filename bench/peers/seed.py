#!/usr/bin/env python3
"""Seeds bench/peers/run.py's run cache from a results JSON it wrote, so that
a machine without the cache extends the committed results instead of running
them again:

    python3 bench/peers/seed.py bench/results/peers.json

Every run of the results whose settings have no cached record becomes one:
its settings are its grid, sweep or repeat row's (as run.py names them), its
workers' results, commands, interface counters, commit and load are the
JSON's, and worker 0's curve is the one the table kept (samples, wall time,
validation loss; the other workers' curves are not in the results, and the
table does not read them); a failed run's record holds its error instead,
kept apart as run.py keeps a failure. The record names the JSON it came from
(`seeded_from`). A run whose name no row of the current grid has is an error:
its settings are unknown.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import run as harness


def rows_by_name(result: dict) -> dict:
    """The settings of every run the results can hold, by name: the grid's
    rows at the lr the results ran them with, their repeats, and the sweep's
    rows."""
    lrs = {row["name"]: row["lr"] for row in result["rows"]}
    out = {}
    for r in harness.grid(False):
        out[r["name"]] = dict(r, lr=lrs.get(r["name"], r["lr"]))
    for name in result["runs"]:
        base, _, k = name.rpartition("-r")
        if k.isdigit() and base in out and name not in out:
            out[name] = dict(harness.repeat_of(out[base], int(k)), lr=lrs.get(name))
    for size, at in result.get("lr_sweep", {}).items():
        for system, sweep in at["systems"].items():
            for entry in sweep["runs"]:
                r = harness.sweep_row(size, system, entry["lr"])
                out.setdefault(r["name"], r)
    return out


def records(result: dict, source: str) -> dict:
    """The cache records of the results' runs, by name."""
    settings = rows_by_name(result)
    table = {row["name"]: row for row in result["rows"]}
    out = {}
    # The table's runs first: a sweep run that is also a grid row is cached
    # once, with the curve only the table kept.
    for name in sorted(result["runs"], key=lambda n: n not in table):
        run = result["runs"][name]
        if name not in settings:
            raise ValueError(f"{source}: run {name!r} is not a row of the current grid, "
                             "its sweep or a repeat of either: its settings are unknown")
        r = {k: v for k, v in settings[name].items() if k != "name"}
        if r["lr"] is None:
            raise ValueError(f"{source}: run {name!r} has no lr in the results' rows")
        rec = {"run": r, "commands": run["worker_commands"], "elapsed_s": run["elapsed_s"],
               "load_1min": table.get(name, {}).get("load_1min"),
               "commit": run["commit"], "cpu": run.get("cpu"), "seeded_from": source}
        if "error" in run:
            rec["error"] = run["error"]
        else:
            rec["ranks"] = [dict(x) for x in run["ranks"]]
            rec["wire"] = run["wire"]
            if name in table:
                rec["ranks"][0]["curve"] = table[name]["curve"]
        out[name] = rec
    return out


def seed(result_path: str, cache: str) -> tuple:
    """Writes the records the cache lacks; returns (written, already cached)."""
    with open(result_path) as f:
        result = json.load(f)
    if result.get("quick"):
        raise ValueError(f"{result_path}: a --quick result; its runs are not the grid's")
    os.makedirs(cache, exist_ok=True)
    written, present = [], []
    for name, rec in records(result, os.path.relpath(result_path, harness.ROOT)).items():
        r = dict(rec["run"], name=name)
        failed = "error" in rec
        if (harness.cached(cache, r) is not None
                or failed and harness.cached(cache, r, failed=True) is not None):
            present.append(name)
            continue
        harness.store(harness.cache_path(cache, r, failed=failed), rec)
        written.append(name)
    return written, present


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", help="a results JSON of bench/peers/run.py (not --quick)")
    ap.add_argument("--cache", default=harness.CACHE, help="the directory of cached runs")
    args = ap.parse_args()
    try:
        written, present = seed(args.results, args.cache)
    except (OSError, ValueError, KeyError) as e:
        print(f"bench/peers/seed.py: {e}", file=sys.stderr)
        return 1
    print(f"seeded {len(written)} runs into {args.cache} ({len(present)} were cached already)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
