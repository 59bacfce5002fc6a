"""Fashion-MNIST on several worker processes, co2 against DDP, from one command.

    /usr/bin/python3 examples/python/train_fashion_mnist.py            # build tree
    /usr/bin/python3 examples/python/train_fashion_mnist.py --workers 2 --epochs 1

Starts local aggregator shards (co2.local_aggregator), trains the CNN with
co2.Optimizer on every worker, then the same model with torch's
DistributedDataParallel (Gloo), and prints both side by side: final test
accuracy, wall time, and the share of time each spent waiting for the network.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Dict

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
# The build tree's package, when it has not been installed.
sys.path.insert(1, os.path.join(HERE, "..", "..", "build", "python"))

import co2  # noqa: E402
import fashion_mnist  # noqa: E402


def _batches(args, rank: int):
    x, y = fashion_mnist.load("train")
    g = torch.Generator().manual_seed(args.seed)
    order = torch.cat([torch.randperm(len(x), generator=g) for _ in range(args.epochs)])
    mine = order[rank::args.workers]
    steps = len(mine) // args.batch
    return x, y, mine, steps


def _progress(done: int, total: int, label: str, start: float) -> None:
    width = 30
    filled = width * done // max(total, 1)
    sys.stderr.write(f"\r{label:4} [{'#' * filled}{'.' * (width - filled)}] "
                     f"{done}/{total} steps  {time.time() - start:5.1f} s")
    if done == total:
        sys.stderr.write("\n")
    sys.stderr.flush()


def _co2_worker(rank: int, args, addresses, joined, results) -> None:
    co2.tune_malloc()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    x, y, mine, steps = _batches(args, rank)
    rounds = (steps + args.tau - 1) // args.tau
    model = fashion_mnist.Net()
    inner = torch.optim.AdamW(model.parameters(), lr=args.co2_lr)
    opt = co2.Optimizer(model.parameters(), inner, tau=args.tau, rounds=rounds,
                        aggregators=addresses, job="fashion-mnist", algo="co2",
                        worker_id=f"worker-{rank}", samples_per_step=args.batch)
    opt.connect()  # joins the job
    # Every worker joins before any trains, so that all of them start at
    # round 0 (one that joined a running job would start at its open round).
    joined.wait(timeout=300)
    start = time.time()
    for s in range(opt.round * args.tau, steps):
        idx = mine[s * args.batch:(s + 1) * args.batch]
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
        if rank == 0 and (s % 20 == 0 or s == steps - 1):
            _progress(s + 1, steps, "co2", start)
    opt.finish()
    elapsed = time.time() - start
    if rank == 0:
        tx, ty = fashion_mnist.load("test")
        results.put({"accuracy": fashion_mnist.accuracy(model, tx, ty), "seconds": elapsed,
                     "exposed": opt.exposed_comm_seconds / elapsed,
                     "mb_sent": opt.bytes_sent / 1e6})


def _ddp_worker(rank: int, args, init_file: str, results) -> None:
    co2.tune_malloc()  # the same allocator settings for both
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=args.workers)
    torch.manual_seed(args.seed)
    x, y, mine, steps = _batches(args, rank)
    model = torch.nn.parallel.DistributedDataParallel(fashion_mnist.Net())
    opt = torch.optim.AdamW(model.parameters(), lr=args.ddp_lr)
    start = time.time()
    for s in range(steps):
        idx = mine[s * args.batch:(s + 1) * args.batch]
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
        loss.backward()  # DDP all-reduces the gradients inside backward
        opt.step()
        if rank == 0 and (s % 20 == 0 or s == steps - 1):
            _progress(s + 1, steps, "ddp", start)
    elapsed = time.time() - start
    if rank == 0:
        tx, ty = fashion_mnist.load("test")
        results.put({"accuracy": fashion_mnist.accuracy(model.module, tx, ty),
                     "seconds": elapsed, "exposed": None,
                     "mb_sent": None})
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=4, help="worker processes (2-4)")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32, help="samples per worker and step")
    ap.add_argument("--tau", type=int, default=8, help="co2: inner steps per round")
    ap.add_argument("--co2_lr", type=float, default=2e-3)
    ap.add_argument("--ddp_lr", type=float, default=2e-3)
    ap.add_argument("--shards", type=int, default=1, help="local aggregator shards")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    if not 1 <= args.workers <= 8:
        ap.error(f"--workers must be in [1, 8], got {args.workers}")

    ctx = mp.get_context("spawn")
    out: Dict[str, dict] = {}
    with co2.local_aggregator(num_shards=args.shards) as agg:
        q = ctx.SimpleQueue()
        joined = ctx.Barrier(args.workers)
        mp.start_processes(_co2_worker, args=(args, agg.addresses, joined, q),
                           nprocs=args.workers, join=True, start_method="spawn")
        out["co2"] = q.get()
    with tempfile.TemporaryDirectory() as tmp:
        q = ctx.SimpleQueue()
        mp.start_processes(_ddp_worker, args=(args, os.path.join(tmp, "init"), q),
                           nprocs=args.workers, join=True, start_method="spawn")
        out["ddp"] = q.get()

    print(f"\nFashion-MNIST, {args.workers} workers, {args.epochs} epoch(s), "
          f"batch {args.batch} per worker")
    print(f"{'':6}{'test accuracy':>15}{'seconds':>10}{'waiting for network':>22}{'MB sent/worker':>16}")
    for name, r in out.items():
        exposed = f"{100 * r['exposed']:.1f} %" if r["exposed"] is not None else "in backward()"
        sent = f"{r['mb_sent']:.1f}" if r["mb_sent"] is not None else "-"
        print(f"{name:6}{100 * r['accuracy']:>14.2f}%{r['seconds']:>10.1f}{exposed:>22}{sent:>16}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
