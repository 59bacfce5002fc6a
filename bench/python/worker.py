"""One Python worker of bench/python/run.py: the Fashion-MNIST CNN with AdamW
under co2.Optimizer, timed as co2-train times its workers (train_s: from the
joined optimizer to the end of finish()). Prints one JSON line."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples", "python"))
import fashion_mnist  # noqa: E402

import co2  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--aggregators", required=True)
    ap.add_argument("--job", required=True)
    ap.add_argument("--worker", type=int, required=True)
    ap.add_argument("--workers", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--tau", type=int, required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--lr", type=float, required=True)
    ap.add_argument("--rendezvous", required=True,
                    help="host:port of a TCPStore that worker 0 serves")
    ap.add_argument("--plain", action="store_true",
                    help="the same loop with the inner optimizer alone (no co2)")
    args = ap.parse_args()
    co2.tune_malloc()  # as co2-train's main does
    torch.set_num_threads(1)
    torch.manual_seed(1)
    x, y = fashion_mnist.load("train")
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(args.worker))
    model = fashion_mnist.Net()
    # foreach: one fused op per tensor kind, as co2-train's C++ AdamW has no
    # per-parameter Python overhead.
    inner = torch.optim.AdamW(model.parameters(), lr=args.lr, foreach=True)
    rounds = (args.steps + args.tau - 1) // args.tau
    if args.plain:
        opt = inner
    else:
        opt = co2.Optimizer(model.parameters(), inner, tau=args.tau, rounds=rounds,
                            aggregators=args.aggregators.split(","), job=args.job,
                            worker_id=f"worker-{args.worker}", samples_per_step=args.batch,
                            config=co2.JobConfig(alpha=0.5, beta=0.0))
        opt.connect()
    # Every worker has joined before any pushes round 0, as co2-train's
    # leaders rendezvous: all of them are required for every round.
    host, port = args.rendezvous.rsplit(":", 1)
    store = torch.distributed.TCPStore(host, int(port), args.workers, args.worker == 0,
                                       timeout=datetime.timedelta(seconds=120))
    store.set(f"joined-{args.worker}", "1")
    store.wait([f"joined-{w}" for w in range(args.workers)])
    first_step = 0 if args.plain else opt.round * args.tau
    start = time.perf_counter()
    for step in range(first_step, args.steps):
        first = (step * args.batch) % (len(order) - args.batch)
        idx = order[first:first + args.batch]
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        loss.item()
        opt.step()
    if not args.plain:
        opt.finish()
    train_s = time.perf_counter() - start
    exposed = 0.0 if args.plain else opt.exposed_comm_seconds
    print(json.dumps({"worker": args.worker, "steps": args.steps - first_step, "train_s": train_s,
                      "exposed_comm_s": exposed}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
