"""co2's memory and traffic per local rank: a node's L local ranks each
exchanging their own slice of the model (rank slices, replicated or FSDP2)
against local rank 0 alone exchanging the whole model
(docs/results/sharding-memory.md).

One node on loopback: S shards (``co2.local_aggregator``, with
checkpoints), τ = 2, 2 rounds and ``finish()``, inner SGD without momentum,
``carry_progress=False``. Each grid point (mode × L) runs twice under
torchrun, with co2 and without it (the inner optimizer alone: same model,
data, steps and gradient averaging), so that the difference of the ranks'
peak resident memory is what co2 adds. A point whose estimated memory does
not fit the budget is not started; its row comes from the accounting.

    bash bench/run_zero.sh                              # 503M params, the grid
    bash bench/run_zero.sh --hidden 1024 --layers 8     # 8.4M params, ~20 s a point

The driver runs ``--worker`` processes under torchrun; one of them is one
local rank and writes its measurements as JSON.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import platform
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
GIB = 1024 ** 3
MODES = ("alone", "slices", "fsdp2")
# co2's state in bytes per parameter with fp32 and carry_progress=False:
# anchor 4 + uplink buffer 4 + downlink buffer 4 (docs: notes §5); FSDP2 on
# CPU adds the float32 mirror of the rank's shards, 4.
E_REPLICATED = 12
E_FSDP2 = 16
# The service's elements per block: slices are whole shards, shards whole
# blocks, so a slice differs from P/L by less than S/L blocks.
BLOCK = 65536
# Bytes per parameter the S shards hold together, with checkpoints
# (docs/performance.md, the aggregator's memory), and each shard's own.
SHARD_BYTES_PER_PARAM = 2.16 * 4
SHARD_FIXED_GIB = 0.05
# The ranks' malloc: every buffer of 1 MiB or more its own mapping, returned
# when freed (no dynamic threshold), so that VmHWM follows the live buffers,
# not what glibc's heap keeps of freed ones (in both runs alike).
MALLOC_TUNABLE = "glibc.malloc.mmap_threshold=1048576"
# A rank's resident memory beside its parameters, gradients and co2's state
# (torch, Gloo, autograd after the first backward), measured without co2 at
# 8.4M to 134M parameters: 0.675 GiB; rounded up, and more for FSDP2's own.
# FSDP2's unsharded parameters and gradients in flight: 1.1 to 1.7 layers'
# (8 B per parameter of a layer) at 67M parameters, beyond the replicated
# model's 0.675 GiB (2.4 at 8.4M, where FSDP2's fixed cost weighs more).
IDLE_GIB = {"replicated": 0.7, "fsdp2": 0.75}
# torchrun's own process (its agent imports torch): 528 to 645 MiB measured.
TORCHRUN_GIB = 0.65
FSDP2_LAYERS_IN_FLIGHT = 2
# What co2 costs a process beside its state (its libraries, and on a rank
# that exchanges its gRPC channels and threads): 8, and 9 to 36 MiB in all, at
# 8.4M parameters. The resident-memory checks are made only where 10 % of a
# rank's share of co2's state is above this, so that they test the share.
FIXED_MIB = 64


# --- the worker: one local rank under torchrun ------------------------------

def proc_status(pid: str = "self") -> Dict[str, int]:
    """VmHWM and VmRSS of a process, in bytes."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS"):
                out[key] = int(value.split()[0]) * 1024
    return out


class Phases:
    """This process's peak resident memory phase by phase: each mark reads
    VmHWM and VmRSS, then resets VmHWM to the current VmRSS (clear_refs 5),
    so that a mark's VmHWM is the peak since the previous one and its
    ``peak`` the peak since the process started (the VmHWM it would read
    without the resets)."""

    def __init__(self) -> None:
        self.marks: Dict[str, Dict[str, int]] = {}
        self.peak = 0

    def mark(self, name: str) -> None:
        status = proc_status()
        self.peak = max(self.peak, status["VmHWM"])
        status["peak"] = self.peak
        self.marks[name] = status
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")


def build_model(args, rank: int, world: int):
    """``layers`` × Linear(hidden, hidden) made on the meta device, then allocated
    (FSDP2: each rank its shards only) and filled with seeded N(0, 1/hidden)
    weights and zero biases, so that the activations keep their scale."""
    import torch
    with torch.device("meta"):
        model = torch.nn.Sequential(*[torch.nn.Linear(args.hidden, args.hidden)
                                      for _ in range(args.layers)])
    if args.mode == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (world,))
        for layer in model:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    model.to_empty(device="cpu")
    g = torch.Generator().manual_seed(1000 + (rank if args.mode == "fsdp2" else 0))
    with torch.no_grad():
        for name, p in model.named_parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            if name.endswith("bias"):
                local.zero_()
            else:
                local.normal_(0.0, args.hidden ** -0.5, generator=g)
    return model


def worker(args) -> int:
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    # The driver kills the ranks by these when the run must stop (torchrun
    # starts each in a session of its own).
    with open(os.path.join(args.out, f"pid-{rank}"), "w") as f:
        f.write(str(os.getpid()))
    phases = Phases()
    phases.mark("start")
    model = build_model(args, rank, world)
    numel = sum(p.numel() for p in model.parameters())  # the whole model's P
    phases.mark("model")
    params = list(model.parameters())
    inner = torch.optim.SGD(params, lr=args.lr, momentum=0.0)
    opt: Any = inner
    memory: List[Dict[str, int]] = []
    if args.co2:
        import co2
        # co2 averages the gradients over the node (in DDP-sized buckets, a
        # large gradient in place); FSDP2 reduce-scatters them itself.
        opt = co2.Optimizer(params, inner, tau=args.tau, rounds=args.rounds,
                            aggregators=args.aggregators.split(","), job=args.job,
                            worker_id="node-0", rank_slices=args.mode != "alone",
                            carry_progress=False, apply="boundary",
                            samples_per_step=float(args.batch * world))
        t = time.perf_counter()
        opt.connect()
        connect_s = time.perf_counter() - t
        memory.append(opt.memory())
        phases.mark("connect")
    data = torch.Generator().manual_seed(7 + rank)
    steps: List[Dict[str, Any]] = []
    sent = 0
    for step in range(args.tau * args.rounds):
        x = torch.randn(args.batch, args.hidden, generator=data)
        opt.zero_grad()
        t = time.perf_counter()
        loss = torch.nn.functional.mse_loss(model(x), x)
        loss.backward()
        if args.mode != "fsdp2" and world > 1 and not args.co2:
            # Without co2: per parameter and in place, as co2's averaging
            # does for this model's gradients (each larger than its bucket).
            for p in params:
                dist.all_reduce(p.grad)
                p.grad.div_(world)
        compute_s = time.perf_counter() - t
        phases.mark(f"step{step}.backward")
        t = time.perf_counter()
        opt.step()
        step_s = time.perf_counter() - t
        phases.mark(f"step{step}.step")
        record = {"loss": loss.item(), "compute_s": compute_s, "step_s": step_s,
                  "boundary": (step + 1) % args.tau == 0}
        if args.co2:
            record["bytes_sent"] = opt.bytes_sent - sent
            sent = opt.bytes_sent
            if record["boundary"]:
                memory.append(opt.memory())
        steps.append(record)
    result: Dict[str, Any] = {"rank": rank, "world": world, "mode": args.mode, "co2": args.co2,
                              "numel": numel, "steps": steps}
    if args.co2:
        t = time.perf_counter()
        opt.finish()
        result.update(finish_s=time.perf_counter() - t, connect_s=connect_s,
                      memory=memory, bytes_sent=opt.bytes_sent,
                      rank_slices=opt.rank_slices,
                      co2_numel=opt.config.num_parameters)
    phases.mark("end")
    result["marks"] = phases.marks
    with open(os.path.join(args.out, f"rank-{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()
    return 0


# --- the driver --------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def co2_bytes_per_param(mode: str, L: int) -> List[float]:
    """co2's state on each local rank in bytes per parameter of the model,
    from the accounting arithmetic (FSDP2: ignoring its < S/L blocks of
    padding per rank)."""
    if mode == "alone":
        return [float(E_REPLICATED)] + [0.0] * (L - 1)
    e = E_REPLICATED if mode == "slices" else E_FSDP2
    return [e / L] * L


def estimate(args, mode: str, L: int, numel: int, co2_on: bool) -> Dict[str, float]:
    """The point's memory in bytes, every rank's and the shards': per rank
    its parameters and gradients, 8 B/param (FSDP2: 8/L, plus the unsharded
    parameters and gradients of FSDP2_LAYERS_IN_FLIGHT layers), co2's state
    (co2_bytes_per_param) and IDLE_GIB; torchrun's agent; the shards
    SHARD_BYTES_PER_PARAM."""
    if mode == "fsdp2":
        model = 8 * numel / L + FSDP2_LAYERS_IN_FLIGHT * 8 * numel / args.layers
    else:
        model = 8 * numel
    idle = IDLE_GIB["fsdp2" if mode == "fsdp2" else "replicated"] * GIB
    ranks = [idle + model + (b * numel if co2_on else 0) for b in co2_bytes_per_param(mode, L)]
    shards = (SHARD_BYTES_PER_PARAM * numel + args.shards * SHARD_FIXED_GIB * GIB
              if co2_on else 0.0)
    total = sum(ranks) + TORCHRUN_GIB * GIB + shards
    return {"total": total, "largest_rank": max(ranks), "shards": shards}


class RunFailed(RuntimeError):
    pass


def rank_logs(log_dir: str) -> str:
    """Each rank's stderr (its tail), as torchrun's --log_dir keeps them."""
    parts = []
    for path in sorted(glob.glob(os.path.join(log_dir, "**", "stderr.log"), recursive=True)):
        with open(path, errors="replace") as f:
            text = f.read()
        parts.append(f"--- {os.path.relpath(path, log_dir)}:\n{text[-3000:]}")
    return "\n".join(parts) or "(no rank logs)"


def torchrun(args, mode: str, L: int, co2_on: bool, aggregators: List[str], job: str,
             tmp: str) -> List[Dict[str, Any]]:
    """One run of L ranks; every rank's result. Raises RunFailed, with the
    ranks' stderr, when a rank fails, the run passes its deadline, or the
    box's available memory falls under the floor (the run is killed)."""
    out = os.path.join(tmp, f"{job}-out")
    log_dir = os.path.join(tmp, f"{job}-logs")
    os.makedirs(out)
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1",
               f"--nproc_per_node={L}", "--master_addr=127.0.0.1",
               f"--master_port={free_port()}", "--redirects", "3", "--log_dir", log_dir,
               os.path.abspath(__file__), "--worker", "--mode", mode,
               "--hidden", str(args.hidden), "--layers", str(args.layers),
               "--tau", str(args.tau), "--rounds", str(args.rounds),
               "--batch", str(args.batch), "--lr", str(args.lr), "--out", out,
               "--job", job, "--timeout", str(args.timeout)]
    if co2_on:
        command += ["--co2", "--aggregators", ",".join(aggregators)]
    tunables = [t for t in os.environ.get("GLIBC_TUNABLES", "").split(":") if t]
    env = dict(os.environ, OMP_NUM_THREADS="1",
               GLIBC_TUNABLES=":".join(tunables + [MALLOC_TUNABLE]))
    started = time.monotonic()
    own_log = os.path.join(tmp, f"{job}-torchrun.log")
    with open(own_log, "w") as log:
        p = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log,
                             stderr=subprocess.STDOUT, env=env, start_new_session=True)
    lowest = mem_available()
    agent_hwm = 0
    why = None
    while True:
        try:
            p.wait(timeout=1.0)
            break
        except subprocess.TimeoutExpired:
            pass
        try:
            agent_hwm = max(agent_hwm, proc_status(str(p.pid))["VmHWM"])
        except (FileNotFoundError, KeyError):
            pass
        lowest = min(lowest, mem_available())
        if lowest < args.floor_gib * GIB:
            why = (f"the box's MemAvailable fell to {lowest / GIB:.2f} GiB, under the "
                   f"floor of {args.floor_gib} GiB")
        elif time.monotonic() - started > args.timeout:
            why = f"it ran past its deadline of {args.timeout} s"
        if why:
            kill_run(p, out)
            break
    with open(own_log, errors="replace") as f:
        own = f.read()
    if why is None and p.returncode != 0:
        why = f"torchrun exited {p.returncode}"
    if why is None:
        files = [os.path.join(out, f"rank-{k}.json") for k in range(L)]
        missing = [f for f in files if not os.path.exists(f)]
        if missing:
            why = f"ranks left no result: {missing}"
    if why:
        raise RunFailed(f"{mode} L={L} co2={'on' if co2_on else 'off'} failed: {why}\n"
                        f"torchrun:\n{own[-3000:]}\n{rank_logs(log_dir)}")
    results = []
    for k in range(L):
        with open(os.path.join(out, f"rank-{k}.json")) as f:
            results.append(json.load(f))
    for r in results:
        r["wall_s"] = time.monotonic() - started
        r["lowest_mem_available"] = lowest
        r["torchrun_vmhwm"] = agent_hwm
    return results


def kill_run(p: subprocess.Popen, out: str) -> None:
    """Kills a run's ranks (by the pids they wrote) and its torchrun."""
    for path in glob.glob(os.path.join(out, "pid-*")):
        with open(path) as f:
            text = f.read().strip()
        if text:
            try:
                os.kill(int(text), signal.SIGKILL)
            except ProcessLookupError:
                pass
    os.killpg(p.pid, signal.SIGKILL)
    p.wait(timeout=30)


def shard_status(agg) -> List[Dict[str, int]]:
    return [proc_status(str(p.pid)) for p in agg.processes]


def run_on(args, mode: str, L: int, tmp: str) -> Dict[str, Any]:
    import co2
    job = f"zero-{mode}-{L}"
    with co2.local_aggregator(num_shards=args.shards, checkpoints=True,
                              round_timeout=f"{args.timeout}s") as agg:
        ranks = torchrun(args, mode, L, True, agg.addresses, job, tmp)
        shards = shard_status(agg)
    return {"ranks": ranks, "shards": shards}


def derive(args, mode: str, L: int, on: Dict[str, Any],
           off: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Per rank: co2's peak resident memory over the run without it, its
    accounting and its bytes per round, each per parameter of the model; and
    the pass/fail targets."""
    numel = on["ranks"][0]["numel"]
    expected = co2_bytes_per_param(mode, L)
    rows = []
    for r, o in zip(on["ranks"], off):
        acc = max(m["total"] for m in r["memory"])
        hwm_delta = r["marks"]["end"]["peak"] - o["marks"]["end"]["peak"]
        last = f"step{len(r['steps']) - 1}.step"
        boundary = [s for s in r["steps"] if s["boundary"]]
        plain = [s["step_s"] for s in r["steps"] if not s["boundary"]]
        rows.append({
            "rank": r["rank"],
            "vmhwm_on": r["marks"]["end"]["peak"], "vmhwm_off": o["marks"]["end"]["peak"],
            "vmrss_trained_on": r["marks"][last]["VmRSS"],
            "vmrss_trained_off": o["marks"][last]["VmRSS"],
            "hwm_delta_per_param": hwm_delta / numel,
            "hwm_beyond_accounting_mib": (hwm_delta - acc) / 2 ** 20,
            "accounting": r["memory"][-1], "accounting_per_param": acc / numel,
            "expected_per_param": expected[r["rank"]],
            "bytes_per_round": [s["bytes_sent"] for s in boundary],
            "bytes_per_round_per_param": [s["bytes_sent"] / numel for s in boundary],
            "boundary_s": [s["step_s"] for s in boundary],
            "plain_step_s": plain, "finish_s": r["finish_s"],
            "off_step_s": [s["step_s"] for s in o["steps"]],
        })
    checks = {}
    # The accounting is E/L per rank (E on rank 0 alone), to the blocks a
    # slice is made of.
    slack = (args.shards // L + 1) * BLOCK / numel if mode != "alone" else 0.0
    e = E_REPLICATED if mode != "fsdp2" else E_FSDP2
    checks["accounting_is_E_over_L"] = all(
        abs(row["accounting_per_param"] - row["expected_per_param"]) <= e * slack + 1e-9
        for row in rows)
    # What the resident memory shows co2 adds agrees with the accounting, to
    # 10 % of what a rank's share is (E/L; E for the leader alone).
    share = e / (1 if mode == "alone" else L)
    resident = 0.1 * share * numel >= FIXED_MIB * 2 ** 20
    checks["hwm_within_10pct_of_accounting"] = all(
        abs(row["hwm_delta_per_param"] - row["accounting_per_param"]) <= 0.1 * share
        for row in rows)
    # Bytes per round per rank: 4P/L (4P from rank 0 alone), and the ranks'
    # slices tile the exchanged vector.
    want = [4.0] + [0.0] * (L - 1) if mode == "alone" else [4.0 / L] * L
    checks["bytes_per_round_4P_over_L"] = all(
        abs(b - want[row["rank"]]) <= 4 * slack + 1e-9
        for row in rows for b in row["bytes_per_round_per_param"])
    co2_numel = on["ranks"][0]["co2_numel"]
    checks["bytes_tile_the_model"] = all(
        sum(row["bytes_per_round"][i] for row in rows) == 4 * co2_numel
        for i in range(len(rows[0]["bytes_per_round"])))
    if L > 1:
        others = [row["vmhwm_on"] for row in rows[1:]]
        excess = (rows[0]["vmhwm_on"] - sum(others) / len(others)) / numel
        if mode == "alone":
            # The leader alone is the largest process, by co2's E·P.
            checks["rank0_largest_by_E"] = abs(excess - e) <= 0.1 * e
        else:
            # With slices it no longer is: its excess over the other ranks
            # is under 10 % of what the leader alone holds (E·P).
            checks["rank0_not_largest"] = excess <= 0.1 * e
    na = {}
    if not resident:
        for name in ("hwm_within_10pct_of_accounting", "rank0_largest_by_E",
                     "rank0_not_largest"):
            if name in checks:
                na[name] = checks.pop(name)
    return {"ranks": rows, "checks": checks, "resident_checks_apply": resident,
            "resident_checks_not_applied": na}


def compare_with_alone(points: List[Dict[str, Any]]) -> None:
    """Adds to each measured slices point the check that its largest process
    is smaller than the leader alone's rank 0 at the same L."""
    alone = {p["local_ranks"]: p for p in points
             if p["mode"] == "alone" and p["status"] == "measured"}
    for p in points:
        if (p["mode"] == "slices" and p["status"] == "measured" and p["local_ranks"] > 1
                and p["resident_checks_apply"]):
            other = alone.get(p["local_ranks"])
            if other is not None:
                p["checks"]["largest_below_alone_rank0"] = (
                    max(r["vmhwm_on"] for r in p["ranks"]) < other["ranks"][0]["vmhwm_on"])


def skipped_point(args, mode: str, L: int, numel: int, need: Dict[str, float]) -> Dict[str, Any]:
    return {
        "mode": mode, "local_ranks": L, "status": "skipped",
        "reason": (f"from the accounting, not measured: would need "
                   f"{need['total'] / GIB:.1f} GiB, over the budget of {args.budget_gib} GiB"),
        "estimate_gib": need["total"] / GIB,
        "from_accounting": {
            "co2_per_param": co2_bytes_per_param(mode, L),
            "bytes_per_round_per_param": ([4.0] + [0.0] * (L - 1) if mode == "alone"
                                          else [4.0 / L] * L)},
    }


def _per_rank(values: List[float], digits: int = 2) -> str:
    return " / ".join(f"{v:.{digits}f}" for v in values)


def table(report: Dict[str, Any]) -> str:
    """The results as the Markdown table of docs/results/sharding-memory.md:
    one row per point, per-rank figures as rank 0 / rank 1 / ..."""
    lines = ["| mode | L | co2 accounting, B/param | VmHWM on − off, B/param | expected | "
             "beyond the accounting, MiB | Δ bytes per round / P | boundary s, rounds 0, 1 | "
             "finish s | largest VmHWM, GiB | checks |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for pt in report["points"]:
        head = f"| {pt['mode']} | {pt['local_ranks']} |"
        if pt["status"] == "skipped":
            per = pt["from_accounting"]
            lines.append(f"{head} {_per_rank(per['co2_per_param'])} | not measured: would "
                         f"need {pt['estimate_gib']:.1f} GiB | "
                         f"{_per_rank(per['co2_per_param'])} | – | "
                         f"{_per_rank(per['bytes_per_round_per_param'], 3)} | – | – | – | "
                         f"skipped: from the accounting |")
            continue
        if pt["status"] == "busy":
            lines.append(f"{head} – | {pt['reason']} | – | – | – | – | – | – | not run |")
            continue
        rows = pt["ranks"]
        failed = [k for k, ok in pt["checks"].items() if not ok]
        verdict = "pass" if not failed else "FAIL: " + ", ".join(failed)
        if not pt["resident_checks_apply"]:
            verdict += " (resident checks n/a at this size)"
        rounds = zip(*[row["boundary_s"] for row in rows])
        lines.append(
            f"{head} {_per_rank([r['accounting_per_param'] for r in rows])} | "
            f"{_per_rank([r['hwm_delta_per_param'] for r in rows])} | "
            f"{_per_rank([r['expected_per_param'] for r in rows])} | "
            f"{_per_rank([r['hwm_beyond_accounting_mib'] for r in rows], 0)} | "
            f"{_per_rank([max(r['bytes_per_round_per_param']) for r in rows], 3)} | "
            f"{', '.join(f'{max(t):.2f}' for t in rounds)} | "
            f"{max(r['finish_s'] for r in rows):.2f} | "
            f"{max(r['vmhwm_on'] for r in rows) / GIB:.2f} | "
            f"{verdict} |")
    return "\n".join(lines)


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True,
                          check=True, timeout=30).stdout.strip()


def torch_version() -> str:
    """torch's version with its build tag (2.15.0+cu132), read from its
    version.py: torch is not imported into the driver, which stays small
    beside the ranks it measures."""
    import importlib.util
    spec = importlib.util.find_spec("torch")
    path = os.path.join(os.path.dirname(spec.origin), "version.py")
    with open(path) as f:
        for line in f:
            if line.startswith("__version__"):
                return line.split("=", 1)[1].strip().strip("'\"")
    raise RuntimeError(f"no __version__ in {path}")


def driver(args) -> int:
    numel = args.layers * (args.hidden * args.hidden + args.hidden)
    modes = args.modes.split(",")
    sizes = [int(x) for x in args.local_ranks.split(",")]
    for m in modes:
        if m not in MODES:
            raise SystemExit(f"--modes: {m!r} is not one of {MODES}")
    report: Dict[str, Any] = {
        "benchmark": "zero_memory",
        "command": os.environ.get("ZERO_MEMORY_COMMAND")
                   or shlex.join(["python", "bench/python/zero_memory.py"] + sys.argv[1:]),
        "commit": git("rev-parse", "HEAD"),
        # Tracked files that differ from the commit when it ran.
        "modified": git("status", "--porcelain", "--untracked-files=no").splitlines(),
        "torch": torch_version(),
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "mem_total": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")},
        "settings": {"hidden": args.hidden, "layers": args.layers, "numel": numel,
                     "shards": args.shards, "tau": args.tau, "rounds": args.rounds,
                     "batch": args.batch, "lr": args.lr, "inner": "SGD, momentum 0",
                     "carry_progress": False, "apply": "boundary", "checkpoints": True,
                     "malloc": MALLOC_TUNABLE,
                     "grad_averaging": "co2's (25 MiB buckets, a larger gradient in "
                                       "place); without co2 per parameter in place; "
                                       "FSDP2 reduce-scatters",
                     "budget_gib": args.budget_gib, "floor_gib": args.floor_gib,
                     "estimate": {"idle_gib": IDLE_GIB, "torchrun_gib": TORCHRUN_GIB,
                                  "fsdp2_layers_in_flight": FSDP2_LAYERS_IN_FLIGHT,
                                  "shard_bytes_per_param": SHARD_BYTES_PER_PARAM},
                     "resident_checks_from_mib": FIXED_MIB},
        "points": [], "off_runs": {},
    }
    with tempfile.TemporaryDirectory(prefix="co2-zero-") as tmp:
        for mode in modes:
            for L in sizes:
                family = "fsdp2" if mode == "fsdp2" else "replicated"
                need = estimate(args, mode, L, numel, True)
                if args.dry_run:
                    fits = need["total"] <= args.budget_gib * GIB
                    print(f"{mode} L={L}: estimate {need['total'] / GIB:.1f} GiB "
                          f"(largest rank {need['largest_rank'] / GIB:.1f}, shards "
                          f"{need['shards'] / GIB:.1f}): {'runs' if fits else 'skipped'}")
                    continue
                if need["total"] > args.budget_gib * GIB:
                    print(f"{mode} L={L}: skipped, would need {need['total'] / GIB:.1f} GiB",
                          flush=True)
                    report["points"].append(skipped_point(args, mode, L, numel, need))
                    continue
                available = mem_available()
                if need["total"] + args.floor_gib * GIB > available:
                    # Loud (the run exits 1), but the other points are kept.
                    why = (f"not run: needs about {need['total'] / GIB:.1f} GiB and the box had "
                           f"{available / GIB:.1f} GiB available (busy); rerun it alone")
                    print(f"{mode} L={L}: {why}", file=sys.stderr, flush=True)
                    report["points"].append({"mode": mode, "local_ranks": L,
                                             "status": "busy", "reason": why,
                                             "estimate_gib": need["total"] / GIB})
                    continue
                key = f"{family}-{L}"
                try:
                    if key not in report["off_runs"]:
                        # The same program without co2 for alone and slices.
                        report["off_runs"][key] = torchrun(args, mode, L, False, [],
                                                           f"off-{key}", tmp)
                    t = time.monotonic()
                    on = run_on(args, mode, L, tmp)
                except RunFailed as e:
                    # The points measured so far, beside (not as) the result.
                    report["error"] = str(e)
                    with open(args.out + ".partial", "w") as f:
                        json.dump(report, f, indent=1)
                    raise
                point = {"mode": mode, "local_ranks": L, "status": "measured",
                         "estimate_gib": need["total"] / GIB, "off_run": key,
                         "raw": on, "wall_s": time.monotonic() - t}
                point.update(derive(args, mode, L, on, report["off_runs"][key]))
                report["points"].append(point)
                rows = point["ranks"]
                print(f"{mode} L={L}: co2 B/param by rank (accounting / VmHWM on-off) "
                      + ", ".join(f"{r['accounting_per_param']:.2f}/"
                                  f"{r['hwm_delta_per_param']:.2f}" for r in rows)
                      + f"; checks {point['checks']}; {point['wall_s']:.0f} s", flush=True)
    compare_with_alone(report["points"])
    if args.dry_run:
        return 0
    failed = [f"{p['mode']} L={p['local_ranks']}: {k}" for p in report["points"]
              if p["status"] == "measured" for k, ok in p["checks"].items() if not ok]
    report["failed_checks"] = failed
    busy = [f"{p['mode']} L={p['local_ranks']}" for p in report["points"]
            if p["status"] == "busy"]
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
        f.write("\n")
    print(table(report))
    print(f"wrote {args.out}" + (f"; failed checks: {failed}" if failed else ""))
    if busy:
        print(f"zero_memory: not run, the box was busy: {busy}", file=sys.stderr)
        return 1
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", action="store_true", help="one local rank (under torchrun)")
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--tau", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--timeout", type=int, default=1800,
                    help="seconds one torchrun run (and one collective) may take")
    # worker
    ap.add_argument("--mode", choices=MODES, default="alone")
    ap.add_argument("--co2", action="store_true")
    ap.add_argument("--aggregators", default="")
    ap.add_argument("--job", default="zero")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "zero_memory.json"),
                    help="driver: the JSON report; worker: the folder for its rank's JSON")
    # driver
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--local_ranks", default="1,2,4")
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--budget_gib", type=float, default=20.0,
                    help="a point estimated above this is not started")
    ap.add_argument("--floor_gib", type=float, default=1.5,
                    help="a run is killed when the box's MemAvailable falls under this")
    ap.add_argument("--dry_run", action="store_true",
                    help="print each point's memory estimate and whether it runs")
    ap.add_argument("--table", default="", help="print the table of this report and exit")
    args = ap.parse_args()
    if args.table:
        with open(args.table) as f:
            print(table(json.load(f)))
        return 0
    if args.worker:
        return worker(args)
    try:
        return driver(args)
    except RunFailed as e:
        print(f"zero_memory: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Leave without finalizing the interpreter: torch 2.15's Gloo worker
    # threads can release a tensor after finalization began and abort the
    # process (python/tests/node_worker.py). Everything is written by now.
    os._exit(status)
