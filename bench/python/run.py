"""The Python trainer against co2-train: the same model (the Fashion-MNIST
CNN), data, optimizer (AdamW) and co2 settings, alternated in one invocation.
Reports each side's samples/s per worker and exposed-communication share, and
the Python/C++ ratios (medians over the repeats), at two batch sizes. Each
language also runs its loop without co2 (C++: a one-worker co2-train per
worker, all at once; Python: the inner optimizer alone), which splits the gap
into PyTorch's Python front end (plain Python / plain C++) and what co2 costs
in each language (co2 / plain). docs/performance.md §6.

    /usr/bin/python3 bench/python/run.py [--build build] [--out bench/results/python.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpp_command(args, batch: int, steps: int, workers: int, algo: str,
                tmp: str, name: str) -> list:
    return [os.path.join(args.build, "bin", "co2-train"), "--task=fashion-mnist",
            f"--workers={workers}", f"--steps={steps}", f"--tau={args.tau}",
            f"--batch_size={batch}", "--optimizer=adamw", f"--lr={args.lr}",
            f"--algo={algo}", "--alpha=0.5", "--beta=0", "--eval_every=0", "--threads=1",
            f"--run_dir={tmp}/{name}", f"--report={tmp}/{name}.json"]


def leader_rates(report: str, batch: int) -> list:
    with open(report) as f:
        r = json.load(f)
    return [(batch * x["steps"] / x["train_s"], x["exposed_comm_s"] / x["train_s"])
            for x in r["ranks"] if x["leader"]]


def summary(rates: list) -> dict:
    return {"samples_per_s": statistics.mean(r for r, _ in rates),
            "exposed": statistics.mean(e for _, e in rates)}


def run_cpp(args, batch: int, steps: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(cpp_command(args, batch, steps, args.workers, "co2", tmp, "co2"),
                       check=True, capture_output=True, text=True, timeout=1800)
        return summary(leader_rates(f"{tmp}/co2.json", batch))


def run_cpp_plain(args, batch: int, steps: int) -> dict:
    """The workers' loop without co2: one single-worker co2-train per worker,
    all at once (a one-worker ddp job exchanges nothing)."""
    with tempfile.TemporaryDirectory() as tmp:
        procs = [subprocess.Popen(cpp_command(args, batch, steps, 1, "ddp", tmp, f"w{w}"),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                 for w in range(args.workers)]
        rates = []
        for w, p in enumerate(procs):
            _, stderr = p.communicate(timeout=1800)
            if p.returncode != 0:
                raise RuntimeError(f"co2-train failed: {stderr[-2000:]}")
            rates += leader_rates(f"{tmp}/w{w}.json", batch)
        return summary(rates)


def run_python(args, batch: int, steps: int, job: str, plain: bool = False) -> dict:
    sys.path.insert(0, os.path.join(args.build, "python"))
    import co2
    env = dict(os.environ, PYTHONPATH=os.path.join(args.build, "python"))
    with co2.local_aggregator(num_shards=1) as agg:
        rendezvous = f"127.0.0.1:{free_port()}"
        procs = [subprocess.Popen(
            [sys.executable, os.path.join(HERE, "worker.py"), "--aggregators",
             ",".join(agg.addresses), "--job", job, "--worker", str(w), "--workers",
             str(args.workers), "--steps", str(steps), "--tau", str(args.tau),
             "--batch", str(batch), "--lr", str(args.lr), "--rendezvous", rendezvous]
            + (["--plain"] if plain else []),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            for w in range(args.workers)]
        out = []
        for p in procs:
            stdout, stderr = p.communicate(timeout=1800)
            if p.returncode != 0:
                raise RuntimeError(f"python worker failed: {stderr[-2000:]}")
            out.append(json.loads(stdout.strip().splitlines()[-1]))
    return summary([(batch * x["steps"] / x["train_s"], x["exposed_comm_s"] / x["train_s"])
                    for x in out])


def measure(args, batch: int, steps: int, repeats: int) -> dict:
    """Alternates the four runs `repeats` times at one batch size."""
    runs = []
    for i in range(repeats):
        cpp = run_cpp(args, batch, steps)
        cpp_plain = run_cpp_plain(args, batch, steps)
        py = run_python(args, batch, steps, f"bench-{batch}-{i}")
        py_plain = run_python(args, batch, steps, f"plain-{batch}-{i}", plain=True)
        runs.append({"cpp": cpp, "cpp_plain": cpp_plain, "python": py, "python_plain": py_plain,
                     "samples_ratio": py["samples_per_s"] / cpp["samples_per_s"],
                     "plain_ratio": py_plain["samples_per_s"] / cpp_plain["samples_per_s"],
                     "cpp_co2_layer": cpp["samples_per_s"] / cpp_plain["samples_per_s"],
                     "python_co2_layer": py["samples_per_s"] / py_plain["samples_per_s"],
                     "exposed_points": 100 * (py["exposed"] - cpp["exposed"])})
        r = runs[-1]
        print(f"B={batch} repeat {i}: samples/s/worker C++ co2 {cpp['samples_per_s']:.0f} "
              f"({100 * cpp['exposed']:.1f} % exposed), C++ plain "
              f"{cpp_plain['samples_per_s']:.0f}, Python co2 {py['samples_per_s']:.0f} "
              f"({100 * py['exposed']:.1f} %), Python plain {py_plain['samples_per_s']:.0f}; "
              f"Python / C++ {r['samples_ratio']:.3f}", flush=True)
    keys = ("samples_ratio", "plain_ratio", "cpp_co2_layer", "python_co2_layer",
            "exposed_points")
    return {"batch": batch, "steps": steps, "runs": runs,
            **{f"median_{k}": statistics.median(r[k] for r in runs) for k in keys}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--samples", type=int, default=25600,
                    help="samples per worker and run (steps = samples / batch)")
    ap.add_argument("--tau", type=int, default=8)
    ap.add_argument("--batches", default="32,128")
    ap.add_argument("--lr", type=float, default=4e-3)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "python.json"))
    args = ap.parse_args()
    args.build = os.path.abspath(args.build)
    sizes = [measure(args, b, args.samples // b, args.repeats)
             for b in map(int, args.batches.split(","))]
    result = {
        "benchmark": "python_vs_cpp",
        "command": "/usr/bin/python3 bench/python/run.py",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version()},
        "settings": {k: getattr(args, k) for k in ("workers", "samples", "tau", "batches",
                                                   "lr", "repeats")},
        "date": time.strftime("%Y-%m-%d"),
        "batches": sizes,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    for m in sizes:
        print(f"B={m['batch']}: median Python / C++ {m['median_samples_ratio']:.3f} "
              f"(without co2 {m['median_plain_ratio']:.3f}); co2 with / without: C++ "
              f"{m['median_cpp_co2_layer']:.3f}, Python {m['median_python_co2_layer']:.3f}; "
              f"exposed communication {m['median_exposed_points']:+.2f} points")
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
