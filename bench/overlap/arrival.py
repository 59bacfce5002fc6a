#!/usr/bin/env python3
"""bench/run_arrival.sh's runs in bench/results/arrival.json, one at a time.

  arrival.py has   --out=JSON --id=ID     exit 0 if the run is recorded
  arrival.py add   --out=JSON --id=ID --scratch=DIR --workers=N --command=C
  arrival.py table --out=JSON             the table of docs/results/arrival.md
  arrival.py paired --out=JSON --ref=RUN  each run against RUN, paired by seed

A run's record: its final metric (worker 0: Fashion-MNIST's test accuracy on
all 10,000 test images, charlm's validation loss on 1,000 windows),
the share of the workers' training time spent waiting for the network
(exposed_comm_s / train_s, mean over workers), wall time, and for co2 the
inner steps into each round at which its update was applied (0: at the
boundary), summarised as the share applied early and the median and p90 of
those steps. The table gives mean ± sample standard deviation over seeds.
"""
import argparse
import glob
import json
import os
import platform
import statistics
import sys

from summarize import machine


def load(path):
    if not os.path.exists(path):
        return {"runs": {}}
    with open(path) as f:
        return json.load(f)


def save(path, data):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def quantile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def record(scratch, workers, command):
    reports = []
    for w in range(workers):
        with open(os.path.join(scratch, f"rank-{w}-0.json")) as f:
            reports.append(json.load(f))
    final = reports[0]["final_metrics"]
    metric = next((m for m in ("test_accuracy", "val_loss") if m in final), None)
    if metric is None:
        sys.exit(f"arrival.py: worker 0 of {scratch} reports no final metric: {final}")
    hashes = {r["final_hash"] for r in reports}
    if len(hashes) != 1:
        sys.exit(f"arrival.py: the workers of {scratch} ended on different models: {hashes}")
    exposed = [r["exposed_comm_s"] / r["train_s"] for r in reports if r["train_s"] > 0]
    applied = [x.get("applied_after_steps", 0) for r in reports for x in r["rounds"]
               if x.get("steps", 0) > 0]
    early = [d for d in applied if d > 0]
    return {
        "command": command,
        "metric": metric,
        "value": final[metric],
        "exposed_fraction": statistics.mean(exposed),
        "wall_s": max(r["wall_s"] for r in reports),
        "rounds": len(reports[0]["rounds"]),
        "applied_early_fraction": len(early) / len(applied) if applied else 0.0,
        "applied_after_steps_median": statistics.median(early) if early else None,
        "applied_after_steps_p90": quantile(early, 0.9) if early else None,
    }


def table(data):
    groups = {}
    for run_id, r in data["runs"].items():
        task, rate, tau, seed, variant = run_id.split("/")
        groups.setdefault((task, rate, tau, variant), []).append(r)
    lines = ["| task | link | τ | run | seeds | final metric | exposed | applied early "
             "| d median / p90 |",
             "|---|---|---:|---|---:|---:|---:|---:|---:|"]

    def spread(values, scale, digits):
        m = statistics.mean(values) * scale
        if len(values) < 2:
            return f"{m:.{digits}f}"
        return f"{m:.{digits}f} ± {statistics.stdev(values) * scale:.{digits}f}"

    order = {"diloco": 0, "localsgd": 1, "co2-boundary": 2, "co2-arrival": 3,
             "co2-a0.5": 4, "co2-a0.7": 5, "co2-default": 6, "co2-avg-carry": 7}
    blocking = ("diloco", "localsgd")
    for (task, rate, tau, variant), runs in sorted(
            groups.items(),
            key=lambda g: (g[0][0], g[0][1], int(g[0][2][3:]), order.get(g[0][3], 9))):
        if runs[0]["metric"] == "test_accuracy":
            acc = spread([r["value"] for r in runs], 100, 2) + " % accuracy"
        else:
            acc = spread([r["value"] for r in runs], 1, 3) + " loss"
        exp = spread([r["exposed_fraction"] for r in runs], 100, 1) + " %"
        early = "" if variant in blocking else spread(
            [r["applied_early_fraction"] for r in runs], 100, 0) + " %"
        meds = [r["applied_after_steps_median"] for r in runs
                if r["applied_after_steps_median"] is not None]
        p90s = [r["applied_after_steps_p90"] for r in runs
                if r["applied_after_steps_p90"] is not None]
        d = f"{statistics.median(meds):g} / {max(p90s):g}" if meds else ""
        lines.append(f"| {task} | {rate} | {tau[3:]} | {variant} | {len(runs)} | {acc} | "
                     f"{exp} | {early} | {d} |")
    return "\n".join(lines)


def paired(data, ref):
    """Per task, link and τ, each run's mean difference from `ref` over the
    seeds both ran (accuracy in points, loss as it is), ± the standard error
    of that mean: the same seed's data order and initial weights on both
    sides, so the seeds' own spread cancels."""
    groups = {}
    for run_id, r in data["runs"].items():
        task, rate, tau, seed, variant = run_id.split("/")
        groups.setdefault((task, rate, tau), {}).setdefault(variant, {})[seed] = r
    lines = [f"| task | link | τ | run | seeds | minus {ref} |", "|---|---|---:|---|---:|---:|"]
    for (task, rate, tau), runs in sorted(groups.items(),
                                          key=lambda g: (g[0][0], g[0][1], int(g[0][2][3:]))):
        base = runs.get(ref, {})
        for variant, by_seed in sorted(runs.items()):
            seeds = sorted(set(by_seed) & set(base))
            if variant == ref or len(seeds) < 2:
                continue
            scale = 100 if by_seed[seeds[0]]["metric"] == "test_accuracy" else 1
            diffs = [(by_seed[s]["value"] - base[s]["value"]) * scale for s in seeds]
            se = statistics.stdev(diffs) / len(diffs) ** 0.5
            digits = 2 if scale == 100 else 3
            lines.append(f"| {task} | {rate} | {tau[3:]} | {variant} | {len(seeds)} | "
                         f"{statistics.mean(diffs):+.{digits}f} ± {se:.{digits}f} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("action", choices=["has", "add", "table", "paired"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--id", default="")
    ap.add_argument("--scratch", default="")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--command", default="")
    ap.add_argument("--ref", default="diloco", help="paired: the run the others are compared with")
    args = ap.parse_args()
    data = load(args.out)
    if args.action == "has":
        return 0 if args.id in data["runs"] else 1
    if args.action == "add":
        # The CPU a run ran on: its exposed share is only comparable on one.
        data["runs"][args.id] = dict(record(args.scratch, args.workers, args.command),
                                     cpu=machine()["cpu"])
        data["machine"] = {"cpus": os.cpu_count(), "platform": platform.platform()}
        save(args.out, data)
        return 0
    print(paired(data, args.ref) if args.action == "paired" else table(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
