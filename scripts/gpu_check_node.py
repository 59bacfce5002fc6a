"""One node of --nproc local ranks training CUDA parameters with co2.Optimizer
against local co2-aggregator shards: the single-node run of scripts/gpu_check.sh
(docs/gpu-check.md).

    python3 scripts/gpu_check_node.py [--device cuda] [--nproc 2] [--shards 2]

starts the shards (co2.local_aggregator), runs --nproc ranks under torchrun
on one GPU (every rank on cuda:0; the node's group is Gloo, which takes CUDA
tensors, since NCCL refuses two ranks on one device), and prints one line
`node_run: {json}`: what rank 0 saw (whether the ranks agree after every step
and at the end, the anchor round, bytes sent, whether the ranks exchange
slices of the model when this co2.Optimizer has that), and `ok`. It exits 0
only when ok. `--device cpu` runs the same plumbing without a GPU.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time


def _digest(model) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def worker(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist

    import co2

    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    torch.manual_seed(rank)  # different initial models: the anchor unifies them
    model = torch.nn.Sequential(torch.nn.Linear(32, 2048), torch.nn.ReLU(),
                                torch.nn.Linear(2048, 2)).to(device)
    inner = torch.optim.AdamW(model.parameters(), lr=1e-2)
    opt = co2.Optimizer(model.parameters(), inner, tau=args.tau, rounds=args.rounds,
                        aggregators=args.aggregators.split(","), job=args.job,
                        worker_id="node-0", samples_per_step=16 * world)
    data = torch.Generator().manual_seed(100 + rank)  # each rank its own batches
    same_every_step = True
    started = time.monotonic()
    for _ in range(args.tau * args.rounds):
        x = torch.randn(16, 32, generator=data)
        y = (x[:, 0] > 0).long()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x.to(device)), y.to(device)).backward()
        opt.step()
        seen = [None] * world
        dist.all_gather_object(seen, _digest(model))
        same_every_step &= len(set(seen)) == 1
    opt.finish()
    seconds = time.monotonic() - started
    seen = [None] * world
    dist.all_gather_object(seen, _digest(model))
    params_device = str(next(model.parameters()).device)
    if rank == 0:
        print("rank0: " + json.dumps({
            "world": world, "backend": args.backend, "params_device": params_device,
            "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
            "rank_slices": getattr(opt, "rank_slices", "not in this co2.Optimizer"),
            "leader": getattr(opt, "is_leader", None),
            "same_every_step": same_every_step, "same_at_end": len(set(seen)) == 1,
            "round": opt.round, "anchor_round": opt.anchor_round,
            "bytes_sent": opt.bytes_sent, "train_seconds": round(seconds, 3)}), flush=True)
    dist.destroy_process_group()
    return 0


def launch(args: argparse.Namespace) -> int:
    import co2

    result = {"device": args.device, "nproc": args.nproc, "shards": args.shards,
              "tau": args.tau, "rounds": args.rounds, "ok": False}
    with co2.local_aggregator(num_shards=args.shards) as agg:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={args.nproc}",
               # torch 1.13's default "0" parses to None (test_torchrun.py)
               "--redirects", "1", "--tee", "1", os.path.abspath(__file__), "worker",
               f"--aggregators={','.join(agg.addresses)}", f"--job=gpu-check-{os.getpid()}",
               f"--device={args.device}", f"--backend={args.backend}",
               f"--tau={args.tau}", f"--rounds={args.rounds}"]
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
        try:
            p = subprocess.run(cmd, env=env, text=True, capture_output=True,
                               timeout=args.timeout)
            out, rc = p.stdout + p.stderr, p.returncode
        except subprocess.TimeoutExpired as e:
            out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            out += f"\ntimed out after {args.timeout}s"
            rc = 124
    sys.stdout.write(out)
    result["returncode"] = rc
    # torchrun's --tee prefixes each line with the rank ("[0]:", "[default0]:").
    rank0 = [l.split("rank0: ", 1)[1] for l in out.splitlines() if "rank0: {" in l]
    if rank0:
        seen = json.loads(rank0[-1])
        result.update(seen)
        want_device = "cuda:0" if args.device == "cuda" else "cpu"
        result["ok"] = (rc == 0 and seen["same_every_step"] and seen["same_at_end"]
                        and seen["anchor_round"] == args.rounds + 1
                        and seen["bytes_sent"] > 0 and seen["params_device"] == want_device)
    print("node_run: " + json.dumps(result), flush=True)
    return 0 if result["ok"] else 1


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", nargs="?", default="launch", choices=["launch", "worker"])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--backend", default="gloo")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--tau", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=150)
    ap.add_argument("--aggregators", default="")
    ap.add_argument("--job", default="")
    args = ap.parse_args()
    return worker(args) if args.mode == "worker" else launch(args)


if __name__ == "__main__":
    sys.exit(main())
