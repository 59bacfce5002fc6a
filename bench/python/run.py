"""The Python trainer against co2-train: the same model (the Fashion-MNIST
CNN), data, optimizer (AdamW) and co2 settings, alternated in one invocation.
Reports each side's samples/s per worker and exposed-communication share, and
the Python/C++ ratios (medians over the repeats); a third run, the same Python
loop with the inner optimizer alone, splits the gap into PyTorch's Python
front end and the co2 layer. docs/performance.md §6.

    /usr/bin/python3 bench/python/run.py [--build build] [--out bench/results/python.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))


def run_cpp(args) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.json")
        subprocess.run(
            [os.path.join(args.build, "client", "co2-train"), "--task=fashion-mnist",
             f"--workers={args.workers}", f"--steps={args.steps}", f"--tau={args.tau}",
             f"--batch_size={args.batch}", "--optimizer=adamw", f"--lr={args.lr}",
             "--algo=co2", "--alpha=0.5", "--beta=0", "--eval_every=0", "--threads=1",
             f"--run_dir={tmp}/run", f"--report={report}"],
            check=True, capture_output=True, text=True, timeout=1800)
        with open(report) as f:
            r = json.load(f)
    leaders = [rank for rank in r["ranks"] if rank["leader"]]
    return {"samples_per_s": statistics.mean(args.batch * x["steps"] / x["train_s"]
                                             for x in leaders),
            "exposed": statistics.mean(x["exposed_comm_s"] / x["train_s"] for x in leaders)}


def run_python(args, job: str, plain: bool = False) -> dict:
    sys.path.insert(0, os.path.join(args.build, "python"))
    import co2
    env = dict(os.environ, PYTHONPATH=os.path.join(args.build, "python"))
    with co2.local_aggregator(num_shards=1) as agg:
        procs = [subprocess.Popen(
            [sys.executable, os.path.join(HERE, "worker.py"), "--aggregators",
             ",".join(agg.addresses), "--job", job, "--worker", str(w), "--workers",
             str(args.workers), "--steps", str(args.steps), "--tau", str(args.tau),
             "--batch", str(args.batch), "--lr", str(args.lr)] + (["--plain"] if plain else []),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            for w in range(args.workers)]
        out = []
        for p in procs:
            stdout, stderr = p.communicate(timeout=1800)
            if p.returncode != 0:
                raise RuntimeError(f"python worker failed: {stderr[-2000:]}")
            out.append(json.loads(stdout.strip().splitlines()[-1]))
    return {"samples_per_s": statistics.mean(args.batch * x["steps"] / x["train_s"]
                                             for x in out),
            "exposed": statistics.mean(x["exposed_comm_s"] / x["train_s"] for x in out)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--tau", type=int, default=8)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=4e-3)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "python.json"))
    args = ap.parse_args()
    args.build = os.path.abspath(args.build)
    runs = []
    for i in range(args.repeats):
        cpp = run_cpp(args)
        py = run_python(args, f"bench-{i}")
        plain = run_python(args, f"plain-{i}", plain=True)
        runs.append({"cpp": cpp, "python": py, "python_plain": plain,
                     "samples_ratio": py["samples_per_s"] / cpp["samples_per_s"],
                     "plain_ratio": plain["samples_per_s"] / cpp["samples_per_s"],
                     "co2_layer_ratio": py["samples_per_s"] / plain["samples_per_s"],
                     "exposed_points": 100 * (py["exposed"] - cpp["exposed"])})
        print(f"repeat {i}: C++ {cpp['samples_per_s']:.0f} samples/s/worker, "
              f"{100 * cpp['exposed']:.1f} % exposed; Python {py['samples_per_s']:.0f}, "
              f"{100 * py['exposed']:.1f} %; Python without co2 {plain['samples_per_s']:.0f}; "
              f"ratio {runs[-1]['samples_ratio']:.3f}", flush=True)
    result = {
        "benchmark": "python_vs_cpp",
        "command": "/usr/bin/python3 bench/python/run.py",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version()},
        "settings": {k: getattr(args, k) for k in ("workers", "steps", "tau", "batch", "lr",
                                                   "repeats")},
        "date": time.strftime("%Y-%m-%d"),
        "runs": runs,
        "median_samples_ratio": statistics.median(r["samples_ratio"] for r in runs),
        "median_plain_ratio": statistics.median(r["plain_ratio"] for r in runs),
        "median_co2_layer_ratio": statistics.median(r["co2_layer_ratio"] for r in runs),
        "median_exposed_points": statistics.median(r["exposed_points"] for r in runs),
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"median samples/s ratio (Python / C++) {result['median_samples_ratio']:.3f} "
          f"(Python without co2 / C++ {result['median_plain_ratio']:.3f}, "
          f"Python with / without co2 {result['median_co2_layer_ratio']:.3f}); "
          f"exposed communication difference {result['median_exposed_points']:+.2f} points; "
          f"{args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
