#!/usr/bin/env python3
"""Turns bench/run_time_to_accuracy.sh's rank reports into JSON and a plot.

A run's clock is worker 0's training time: the sum over its rounds of
compute (inner steps and, for ddp, the gradient all-reduce) and boundary
(push, wait for the update, apply it), which leaves out the evaluations.
Its curve is the validation accuracy worker 0 measured (1,000 test images)
against that clock. The target is ddp's final test accuracy (all 10,000
test images) minus 0.5 points; an algorithm's time to it is the clock at
its first evaluation at or above the target (None if it never got there).
"""
import argparse
import json
import os
import platform
import shutil
import subprocess
import sys

MARGIN = 0.005  # 0.5 points below ddp's final accuracy


def load(scratch, algo):
    with open(os.path.join(scratch, algo, "rank-0-0.json")) as f:
        report = json.load(f)
    clock, curve = 0.0, []
    for r in report["rounds"]:
        clock += r["compute_s"] + r["boundary_s"]
        if r.get("metric", -1) >= 0:
            curve.append(dict(round=r["round"], train_s=round(clock, 2),
                              accuracy=r["metric"]))
    return dict(algo=algo, steps=report["steps"], train_s=round(clock, 2),
                exposed_comm_s=round(report["exposed_comm_s"], 2),
                final_accuracy=report["final_metrics"]["test_accuracy"],
                curve=curve)


def plot(runs, target, path, title):
    if shutil.which("gnuplot") is None:
        print("gnuplot not found: no plot", file=sys.stderr)
        return None
    data = os.path.splitext(path)[0] + ".dat"
    series = []
    with open(data, "w") as f:
        for i, run in enumerate(runs):
            if i:
                f.write("\n\n")
            for p in run["curve"]:
                f.write(f"{p['train_s']} {100 * p['accuracy']}\n")
            series.append(f"'{data}' index {i} using 1:2 with linespoints "
                          f"title '{run['algo']}'")
    script = [
        "set terminal png size 800,500", f"set output '{path}'",
        f"set title '{title}'", "set xlabel 'training time (s, log scale)'",
        "set logscale x",
        "set ylabel 'validation accuracy (%), 1000 test images'",
        "set key bottom right", "set grid", "set yrange [70:*]",
        f"plot {', '.join(series)}, {100 * target} with lines dt 2 "
        "title 'ddp final - 0.5 pt'"]
    subprocess.run(["gnuplot"], input="\n".join(script), text=True, check=True)
    os.remove(data)
    return path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scratch", required=True)
    ap.add_argument("--algos", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--plot", required=True)
    ap.add_argument("--rate", required=True)
    ap.add_argument("--tau", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--command", required=True)
    a = ap.parse_args()
    runs = [load(a.scratch, algo) for algo in a.algos.split()]
    ddp = next(r for r in runs if r["algo"] == "ddp")
    target = ddp["final_accuracy"] - MARGIN
    for r in runs:
        hit = next((p for p in r["curve"] if p["accuracy"] >= target), None)
        r["time_to_target_s"] = hit["train_s"] if hit else None
    title = (f"Fashion-MNIST, 4 workers behind {a.rate} links, tau = {a.tau}")
    made = plot(runs, target, a.plot, title)
    with open(os.path.join(a.scratch, f"link-{a.rate}.json")) as f:
        link_check = json.load(f)
    doc = dict(benchmark="time_to_accuracy", command=a.command, link=a.rate,
               link_check=link_check,
               tau=a.tau, ddp_steps=a.steps, target_accuracy=round(target, 4),
               machine=dict(cores=os.cpu_count(),
                            kernel=platform.release(),
                            load_average_at_end=os.getloadavg()),
               plot=os.path.relpath(made) if made else None, runs=runs)
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"target {100 * target:.2f} % (ddp final {100 * ddp['final_accuracy']:.2f} % - 0.5)")
    for r in runs:
        t = r["time_to_target_s"]
        print(f"{r['algo']:9} final {100 * r['final_accuracy']:.2f} %  "
              f"train {r['train_s']:7.1f} s  exposed {r['exposed_comm_s']:6.1f} s  "
              f"to target {'never' if t is None else f'{t:.1f} s'}")


if __name__ == "__main__":
    main()
