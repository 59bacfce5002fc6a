"""One node of several processes under torchrun: each rank trains on its own
data; co2.Optimizer averages the gradients over the node in every step and
local rank 0 (or, with rank slices, every rank) talks to the shards. Rank 0
prints one JSON line; with --out every rank also writes its own."""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys

import torch
import hashlib

import torch.distributed as dist

import co2
from digest import params_digest
from worker_exit import exit_without_finalizing



class _LateExchange:
    """Rank 1's exchange as if its slice's update arrived a step later than
    rank 0's: apply_due says no at step 1 of every round."""

    def __init__(self, exchange) -> None:
        self._exchange = exchange

    def apply_due(self, round_, steps):
        return steps != 1 and self._exchange.apply_due(round_, steps)

    def __getattr__(self, name):
        return getattr(self._exchange, name)


def check_state(opt: co2.Optimizer, model: torch.nn.Module, args) -> dict:
    """At a round boundary: this rank's state and the gathered anchor, and
    the refusal of the state by an optimizer with another split."""
    state = opt.state_dict()["co2"]
    anchor = opt.anchor()  # a collective with rank slices
    seen = [None] * dist.get_world_size()
    dist.all_gather_object(seen, hashlib.sha256(anchor.numpy().tobytes()).hexdigest())
    begin, end = state["slice"] if state["slice"] else (0, anchor.numel())
    out = {"slice": state["slice"], "local_ranks": state["local_ranks"],
           "num_shards": state["num_shards"], "anchor_numel": anchor.numel(),
           "state_anchor_numel": state["anchor"].numel(),
           "anchor_same_on_every_rank": len(set(seen)) == 1,
           "state_anchor_is_my_slice": bool(torch.equal(anchor[begin:end], state["anchor"]))}
    fewer = args.aggregators.split(",")[:2]
    clone = copy.deepcopy(model)  # an optimizer rebinds its parameters
    other = co2.Optimizer(clone.parameters(), torch.optim.SGD(clone.parameters(), lr=args.lr),
                          tau=args.tau, rounds=args.rounds, aggregators=fewer, job=args.job,
                          worker_id=args.worker_id)
    try:
        other.load_state_dict(opt.state_dict())
        out["refused"] = None
    except ValueError as e:
        out["refused"] = str(e)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--aggregators", required=True)
    ap.add_argument("--job", required=True)
    ap.add_argument("--tau", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--apply", default=None)
    ap.add_argument("--apply_by_step", type=int, default=0)
    ap.add_argument("--worker_id", default="node-0")
    ap.add_argument("--node_index", type=int, default=0,
                    help="picks this node's batches (not --node: torchrun reads it as its --node-rank)")
    ap.add_argument("--rank_slices", choices=("default", "on", "off"), default="default")
    ap.add_argument("--deterministic", action="store_true")
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--out", default="", help="a folder for every rank's JSON result")
    ap.add_argument("--wait_for_go", action="store_true",
                    help="after joining, local rank 0 waits for a line on stdin")
    ap.add_argument("--late_rank1", action="store_true",
                    help="rank 1's updates count as arrived a step late")
    ap.add_argument("--inner", choices=("sgd", "zero"), default="sgd",
                    help="zero: the same SGD inside a ZeroRedundancyOptimizer")
    ap.add_argument("--check_state", action="store_true",
                    help="after the first round: what state_dict and anchor() hold, and "
                         "whether an optimizer over fewer shards refuses the state")
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    torch.manual_seed(rank)  # different initial models: the anchor unifies them
    model = torch.nn.Sequential(torch.nn.Linear(16, args.hidden), torch.nn.Tanh(),
                                torch.nn.Linear(args.hidden, 1))
    if args.inner == "zero":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        inner = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD,
                                        lr=args.lr, momentum=0.9)
    else:
        inner = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    opt = co2.Optimizer(model.parameters(), inner, tau=args.tau, rounds=args.rounds,
                        aggregators=args.aggregators.split(","), job=args.job,
                        worker_id=args.worker_id, samples_per_step=8 * dist.get_world_size(),
                        apply=args.apply, apply_by_step=args.apply_by_step,
                        config=co2.JobConfig(deterministic=args.deterministic),
                        rank_slices={"default": None, "on": True, "off": False}[args.rank_slices])
    # Each rank (of each node) its own batches.
    data = torch.Generator().manual_seed(100 + 10 * args.node_index + rank)
    if args.wait_for_go:
        opt.connect()
        if rank == 0:
            sys.stdin.readline()
        dist.barrier()
    if args.late_rank1:
        opt.connect()
        if rank == 1:
            opt._exchange = _LateExchange(opt._exchange)
    same_every_step = True
    checks = {}
    for step in range(args.tau * args.rounds):
        if args.check_state and step == args.tau:
            checks = check_state(opt, model, args)
        x = torch.randn(8, 16, generator=data)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
        opt.step()
        seen = [None] * dist.get_world_size()
        dist.all_gather_object(seen, params_digest(model))
        same_every_step &= len(set(seen)) == 1
    opt.finish()
    seen = [None] * dist.get_world_size()
    dist.all_gather_object(seen, params_digest(model))
    if args.out:
        anchor = opt.anchor()
        with open(os.path.join(args.out, f"{args.worker_id}-{rank}.json"), "w") as f:
            json.dump({"rank": rank, "rank_slices": opt.rank_slices,
                       "params": params_digest(model),
                       "anchor": (None if anchor is None else
                                  hashlib.sha256(anchor.numpy().tobytes()).hexdigest()),
                       "bytes_sent": opt.bytes_sent, "round": opt.round, "checks": checks,
                       "applied_after_steps": opt.stats()["applied_after_steps"],
                       "anchor_round": opt.anchor_round,
                       "state": sorted(k for k in opt.state_dict()["co2"])}, f)
    if rank == 0:
        print(json.dumps({"leader": opt.is_leader, "same_every_step": same_every_step,
                          "same_at_end": len(set(seen)) == 1, "round": opt.round,
                          "anchor_round": opt.anchor_round,
                          "bytes_sent": opt.bytes_sent,
                          "applied_after_steps": opt.stats()["applied_after_steps"]}),
              flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    exit_without_finalizing(main())
