"""One node of 2 ranks under torchrun training a model sharded by FSDP2
(``fully_shard`` per layer on a CPU mesh) as one worker of a co2 job: each
rank exchanges its own shards. Every rank writes its JSON result to
--out/WORKER_ID-RANK.json."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import co2
from worker_exit import exit_without_finalizing


def full_digest(model: torch.nn.Module) -> str:
    """The SHA-256 of the whole model's parameters (a collective: every
    rank gathers each parameter's shards)."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.full_tensor().detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--aggregators", required=True)
    ap.add_argument("--job", required=True)
    ap.add_argument("--worker_id", default="node-0")
    ap.add_argument("--node_index", type=int, default=0)
    ap.add_argument("--tau", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=300)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--rank_slices", choices=("default", "off"), default="default")
    ap.add_argument("--out", default="")
    ap.add_argument("--wait_for_go", action="store_true",
                    help="after joining, local rank 0 waits for a line on stdin")
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)  # every rank shards the same initial model
    # The last layer's weight has one row and its bias one element: fewer
    # than L = 2, so rank 1's shards of them are empty.
    model = torch.nn.Sequential(torch.nn.Linear(16, args.hidden), torch.nn.Tanh(),
                                torch.nn.Linear(args.hidden, 1))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    inner = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    opt = co2.Optimizer(model.parameters(), inner, tau=args.tau, rounds=args.rounds,
                        aggregators=args.aggregators.split(","), job=args.job,
                        worker_id=args.worker_id, samples_per_step=8 * world,
                        config=co2.JobConfig(deterministic=True),
                        rank_slices=None if args.rank_slices == "default" else False)
    if args.wait_for_go:
        opt.connect()
        if rank == 0:
            sys.stdin.readline()
        dist.barrier()
    data = torch.Generator().manual_seed(100 + 10 * args.node_index + rank)
    for _ in range(args.tau * args.rounds):
        x = torch.randn(8, 16, generator=data)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
        opt.step()
    memory = opt.memory()
    opt.finish()
    anchor = opt.anchor()
    local = torch.cat([p.to_local().detach().reshape(-1) for p in model.parameters()])
    result = {"rank": rank, "fsdp2": opt.fsdp2, "rank_slices": opt.rank_slices,
              "slice": list(opt._slice), "local_numel": local.numel(),
              "anchor": hashlib.sha256(anchor.numpy().tobytes()).hexdigest(),
              "anchor_is_local_params": bool(torch.equal(anchor, local)),
              "full": full_digest(model), "bytes_sent": opt.bytes_sent,
              "round": opt.round, "anchor_round": opt.anchor_round, "memory": memory,
              "state_slice": opt.state_dict()["co2"]["slice"]}
    with open(os.path.join(args.out, f"{args.worker_id}-{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    exit_without_finalizing(main())
