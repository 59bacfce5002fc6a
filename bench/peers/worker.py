"""One worker of the peers benchmark (bench/peers/run.py starts four, each
in its own network namespace). It trains task.ByteLM with one system through
that system's public API, as the system's docs and examples use it, and
writes one JSON report.

The clock runs from the moment every worker has joined its system (a
TCPStore barrier on worker 0) to the end of the last step, or of co2's
finish(). Worker 0 copies its parameters every eval_every steps (the copy
pauses the clock, for milliseconds) and evaluates the copies after training,
so no evaluation runs while a system exchanges in the background. At a
round's end the copy is the model the workers agree on: the synchronous
systems' parameters after their exchange. co2's agreed model, its anchor
(co2.Optimizer.anchor(); with eager updates or carried progress not the
worker's parameters), takes in a round's update later, when the update
arrives: co2's copy is the anchor at the step it took in the update of a
round ending at a multiple of eval_every steps, labelled with that round's
end (the samples it holds) and timed when it was taken. Between round ends
the copy is worker 0's parameters for every system.
The interface counters of the namespace's eth0 are read at the start and the
end of the clock.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import systems  # noqa: E402
import task  # noqa: E402

BARRIER_PORT = 29400
DDP_PORT = 29500
TORCHFT_STORE_PORT = 29600
LIGHTHOUSE_PORT = 29510
TIMEOUT = datetime.timedelta(seconds=120)


def unflatten(flat: torch.Tensor, like: list) -> list:
    """`flat` (parameters in order, as co2 lays them out) as tensors shaped
    like `like`."""
    parts = flat.split([t.numel() for t in like])
    return [part.view_as(t).to(t.dtype) for part, t in zip(parts, like)]


def counters(dev: str = "eth0") -> dict:
    base = f"/sys/class/net/{dev}/statistics"
    if not os.path.isdir(base):
        return {"tx_bytes": 0, "rx_bytes": 0}
    out = {}
    for name in ("tx_bytes", "rx_bytes"):
        with open(os.path.join(base, name)) as f:
            out[name] = int(f.read())
    return out


def params_digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def barrier(args) -> torch.distributed.TCPStore:
    """Waits until every worker is here. Worker 0 serves the store: the
    caller keeps it for the run, since a store dropped as this returns would
    close under a worker whose wait was not answered yet."""
    store = torch.distributed.TCPStore(args.rank0_addr, BARRIER_PORT, args.workers,
                                       args.rank == 0, timeout=TIMEOUT)
    store.set(f"joined-{args.rank}", "1")
    store.wait([f"joined-{w}" for w in range(args.workers)])
    return store


def torchft_manager(args, model, inner, outer):
    """A torchft Manager for a replica group of one rank, as torchft's
    train_diloco.py makes it (synchronous quorum, which DiLoCo requires)."""
    from torchft import Manager, ProcessGroupGloo

    # The replica group's own store (torchelastic would start it).
    store = torch.distributed.TCPStore(args.addr, TORCHFT_STORE_PORT, 1, True, timeout=TIMEOUT,
                                       wait_for_workers=False)

    def state_dict():
        return {"model": model.state_dict(), "inner": inner.state_dict(),
                "outer": [o.state_dict() for o in outer]}

    def load_state_dict(state):
        model.load_state_dict(state["model"])
        inner.load_state_dict(state["inner"])
        for o, s in zip(outer, state["outer"]):
            o.load_state_dict(s)

    manager = Manager(
        pg=ProcessGroupGloo(timeout=TIMEOUT), min_replica_size=args.workers,
        load_state_dict=load_state_dict, state_dict=state_dict,
        replica_id=f"peers_{args.rank}", lighthouse_addr=f"http://{args.service_addr}:{LIGHTHOUSE_PORT}",
        store_addr=args.addr, store_port=TORCHFT_STORE_PORT, rank=0, world_size=1,
        hostname=args.addr, use_async_quorum=False, timeout=TIMEOUT, quorum_timeout=TIMEOUT,
        connect_timeout=TIMEOUT,
        # Every replica starts from the same seeded model (torchft: "If all of the
        # model weights are initialized identically via a seed this should be False").
        init_sync=False)
    return manager, store


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--system", required=True, choices=("local",) + systems.SYSTEMS)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--workers", type=int, required=True)
    ap.add_argument("--size", required=True, choices=sorted(task.SIZES))
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--tau", type=int, required=True)
    ap.add_argument("--lr", type=float, required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--eval_every", type=int, required=True)
    ap.add_argument("--val_windows", type=int, required=True)
    ap.add_argument("--addr", required=True, help="this worker's address")
    ap.add_argument("--rank0_addr", required=True, help="worker 0's address")
    ap.add_argument("--service_addr", required=True,
                    help="the unshaped host of co2's shards, the lighthouse, hivemind's first peer")
    ap.add_argument("--aggregators", default="", help="co2: the shards, comma-separated")
    ap.add_argument("--initial_peer", default="", help="hivemind: the first peer's multiaddr")
    ap.add_argument("--matchmaking_time", type=float,
                    help="hivemind: its Optimizer's matchmaking_time (run.py's peer_args)")
    ap.add_argument("--averaging_timeout", type=float,
                    help="hivemind: its Optimizer's averaging_timeout (run.py's peer_args)")
    ap.add_argument("--outer_lr", type=float, default=0.7,
                    help="torchft's DiLoCo and streaming DiLoCo: the outer Nesterov lr")
    ap.add_argument("--outer_momentum", type=float, default=0.9,
                    help="torchft's DiLoCo and streaming DiLoCo: the outer momentum")
    ap.add_argument("--fragments", type=int, default=2, help="streaming DiLoCo's fragments")
    ap.add_argument("--fragment_sync_delay", type=int, default=1,
                    help="streaming DiLoCo's fragment_sync_delay (steps)")
    ap.add_argument("--job", default="peers")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.system == "hivemind" and None in (args.matchmaking_time, args.averaging_timeout):
        ap.error("hivemind needs --matchmaking_time and --averaging_timeout")
    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "eth0")

    size = task.SIZES[args.size]
    train, val = task.load_split()
    windows = task.validation_batches(val, size, args.val_windows)
    batches = task.Batches(train, size, args.seed, args.rank, args.workers)
    model = task.make_model(size, args.seed)
    inner = torch.optim.AdamW(model.parameters(), lr=args.lr)
    samples_per_step = size.batch * args.workers
    system, tau = args.system, args.tau
    opt, finish, step_model, notes = inner, None, model, {}
    contexts = []

    if system == "ddp":
        torch.distributed.init_process_group(
            "gloo", init_method=f"tcp://{args.rank0_addr}:{DDP_PORT}", rank=args.rank,
            world_size=args.workers, timeout=TIMEOUT)
        step_model = torch.nn.parallel.DistributedDataParallel(model)
    elif system.startswith("torchft-"):
        from torchft.local_sgd import DiLoCo, LocalSGD
        if system == "torchft-localsgd":
            manager, _store = torchft_manager(args, model, inner, [])
            contexts.append(LocalSGD(manager, model, inner, sync_every=tau))
        else:
            # Outer Nesterov SGD; by default lr 0.7, momentum 0.9: the DiLoCo
            # paper's setting, which torchft's train_diloco.py uses.
            frags = ([model] if system == "torchft-diloco"
                     else task.fragments(model, args.fragments))
            outer = [torch.optim.SGD(f.parameters(), lr=args.outer_lr,
                                     momentum=args.outer_momentum, nesterov=True)
                     for f in frags]
            notes["outer"] = {"lr": args.outer_lr, "momentum": args.outer_momentum}
            manager, _store = torchft_manager(args, model, inner, outer)
            # On CPU: no pinned backup (needs an accelerator); no quantized
            # exchange (torchft's quantization is CUDA/Triton only).
            kw = dict(backup_device=torch.device("cpu"), pin_memory=False, should_quantize=False)
            if system == "torchft-streaming":
                kw.update(fragment_sync_delay=args.fragment_sync_delay)
                notes["fragments"] = len(frags)
                notes["fragment_sync_delay"] = args.fragment_sync_delay
            contexts.append(DiLoCo(manager, frags, inner, outer if len(outer) > 1 else outer[0],
                                   sync_every=tau, **kw))
    elif system == "hivemind":
        import hivemind
        dht = hivemind.DHT(initial_peers=[args.initial_peer],
                           host_maddrs=[f"/ip4/{args.addr}/tcp/0"], start=True)
        # hivemind's quickstart: local updates, one epoch (one averaging) per
        # tau steps of every worker; its timings from run.py's peer_args.
        opt = hivemind.Optimizer(
            dht=dht, run_id=args.job, batch_size_per_step=size.batch,
            target_batch_size=samples_per_step * tau, optimizer=inner,
            use_local_updates=True, matchmaking_time=args.matchmaking_time,
            averaging_timeout=args.averaging_timeout, verbose=False)
        notes["matchmaking_time"] = args.matchmaking_time
        notes["averaging_timeout"] = args.averaging_timeout
        finish = lambda: (opt.shutdown(), dht.shutdown())
    elif system.startswith("co2"):
        import co2
        extra = {}
        if system in ("co2-diloco", "co2-localsgd"):
            extra["algo"] = system[len("co2-"):]
        # "co2": the package's defaults, LocalSGD's outer step (the plain
        # average) with carried progress on co2's overlapped exchange.
        if system.startswith("co2-a0.5"):
            extra["config"] = co2.JobConfig(alpha=0.5)
        if system in ("co2-a0.5", "co2-nocarry"):
            extra["carry_progress"] = False
        # "co2-int8": the defaults with both directions int8 (Δ with error
        # feedback), a quarter of fp32's bytes.
        if system == "co2-int8":
            extra["config"] = co2.JobConfig(downlink_codec="int8")
            extra["uplink_codec"] = "int8"
        # "co2-by1": the defaults, each update applied by the first inner
        # step of the round after the one it averages (apply_by_step).
        if system == "co2-by1":
            extra["apply_by_step"] = 1
        # "co2-boundary": the defaults, each update applied at the boundary
        # of the round after the one it averages.
        if system == "co2-boundary":
            extra["apply"] = "boundary"
        opt = co2.Optimizer(model.parameters(), inner, tau=tau, rounds=args.steps // tau,
                            aggregators=args.aggregators.split(","), job=args.job,
                            worker_id=f"worker-{args.rank}", samples_per_step=size.batch,
                            update_timeout=120.0, **extra)
        opt.connect()
        notes["co2_settings"] = {k: str(v) for k, v in extra.items()}
        notes["co2_settings"]["apply"] = opt.apply

        def finish():
            opt.finish()
            # Per round, the inner steps done when its update was applied.
            notes["applied_after_steps"] = opt.stats()["applied_after_steps"]

    for c in contexts:
        c.__enter__()
    store = barrier(args)  # noqa: F841 (worker 0 serves it until the run ends)
    snapshots = []
    is_co2 = system.startswith("co2")
    anchor_held = 0
    clock = 0.0
    step_s = 0.0
    eval_s = 0.0
    net0 = counters()
    start = time.perf_counter()
    for step in range(args.steps):
        batch = batches.next()
        opt.zero_grad()
        task.loss_of(step_model, batch).backward()
        t = time.perf_counter()
        opt.step()
        step_s += time.perf_counter() - t
        if args.rank != 0:
            continue
        # Copies of the model now, evaluated after training: an evaluation
        # in the loop would pause the clock while a system's background
        # exchange goes on, which favours the overlapping ones. A step may
        # take two: co2's anchor and, mid-round, the parameters.
        points = []  # (the steps the copy holds, whether it is co2's anchor)
        if is_co2:
            # co2's anchor when it has just taken in a round's update, labelled
            # with the steps of the rounds it holds.
            held = (opt.anchor_round - opt.config.max_staleness) * tau
            if held > anchor_held:
                anchor_held = held
                if held % args.eval_every == 0 and held < args.steps:
                    points.append((held, True))
        if ((step + 1) % args.eval_every == 0 and step + 1 < args.steps
                and not (is_co2 and (step + 1) % tau == 0)):
            points.append((step + 1, False))
        if points:
            now = time.perf_counter()
            clock += now - start
            for point, of_anchor in points:
                if of_anchor:
                    params = unflatten(opt.anchor(), list(model.parameters()))
                else:
                    params = [p.detach().clone() for p in model.parameters()]
                snapshots.append(({"step": point, "samples": point * samples_per_step,
                                   "wall_s": clock}, params))
            start = time.perf_counter()
            eval_s += start - now
    for c in reversed(contexts):
        c.__exit__(None, None, None)
    if finish is not None:
        t = time.perf_counter()
        finish()
        step_s += time.perf_counter() - t
    clock += time.perf_counter() - start
    net1 = counters()
    # Training is over: the evaluations may take every core.
    torch.set_num_threads(os.cpu_count() or 1)
    final = task.evaluate(model, windows)
    curve = []
    with torch.no_grad():
        last = [p.detach().clone() for p in model.parameters()]
        for point, params in snapshots:
            for p, v in zip(model.parameters(), params):
                p.copy_(v)
            curve.append(dict(point, val_loss=task.evaluate(model, windows)))
        for p, v in zip(model.parameters(), last):
            p.copy_(v)
    curve.append({"step": args.steps, "samples": args.steps * samples_per_step,
                  "wall_s": clock, "val_loss": final})
    report = {"rank": args.rank, "system": system, "train_s": clock, "optimizer_step_s": step_s,
              "eval_s": eval_s, "final_val_loss": final, "curve": curve,
              "params": task.count_parameters(model), "params_digest": params_digest(model),
              "net_tx_bytes": net1["tx_bytes"] - net0["tx_bytes"],
              "net_rx_bytes": net1["rx_bytes"] - net0["rx_bytes"], "notes": notes}
    if system == "ddp":
        torch.distributed.destroy_process_group()
    with open(args.out, "w") as f:
        json.dump(report, f)
    return 0


if __name__ == "__main__":
    try:
        code = main()
    except Exception:
        traceback.print_exc()
        sys.stderr.flush()
        # A peer's non-daemon threads (hivemind's progress tracker) would
        # keep a failed worker alive until the harness's deadline.
        os._exit(1)
    sys.exit(code)
