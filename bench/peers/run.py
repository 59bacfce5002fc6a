#!/usr/bin/env python3
"""co2 against the systems its users would pick instead, on the same work:
torch DDP (Gloo), torchft's DiLoCo, streaming DiLoCo and LocalSGD, hivemind's
Optimizer with local updates, and co2 (its defaults; its blocking DiLoCo;
alpha 0.5 without and with carried progress; alpha 1 without it; the
defaults with an int8 exchange), each through its own public API
(bench/peers/worker.py), training the byte-level transformer of
bench/peers/task.py with 4 workers. Every system runs at its best inner lr
for the model's size, from one shared sweep per size (seed 1, unshaped,
tau 16).

Each worker runs in its own network namespace behind its own link (unshaped,
or tc tbf at 1 Gbit/s or 100 Mbit/s in both directions; bench/overlap/netns.sh);
co2's shards, torchft's lighthouse and hivemind's first peer run in the
service namespace behind an unshaped link. Bytes on the wire are the
namespaces' eth0 counters. Writes bench/results/peers.json (or
peers_quick.json) and, for the full grid, bench/results/peers.png.

    sudo python3 bench/peers/run.py --quick      # a few minutes: the tiny model, 100 Mbit/s
    sudo python3 bench/peers/run.py              # the grid, headline rows first (resumable)

Runs are cached in $CO2_CACHE_DIR/peers-runs (one JSON per run, keyed by its
settings, recording the commit it ran at; --cache picks another directory);
a rerun skips what is cached. A failed run is kept apart (with its error):
the results show it as failed, and a rerun that selects its row runs it again.
--only selects rows by name (or shell-style patterns: small-100mbit-tau16-*);
--max_minutes stops starting runs after that long, and the results then list
the rows that were not run. Needs root, iproute2, tc.

The referee's campaign (issue 63; referee.py, budget.json, stats.py):

    python3 bench/peers/run.py --referee all --plan   # every run, its estimate, the total
    sudo python3 bench/peers/run.py --referee select    # budget.json on seed 1, unshaped;
                                                        # writes bench/results/peers_frozen.json
    sudo python3 bench/peers/run.py --referee headline  # seeds 2-6, 100 Mbit/s and 1 Gbit/s at 50 ms
    sudo python3 bench/peers/run.py --referee loss      # 100 Mbit/s, 100 ms, 0.1 % loss, seeds 2-4
    sudo python3 bench/peers/run.py --referee smoke     # tiny: one cell, both topologies, co2 and ddp

Each cell's link is ov_link's (rate, RTT and loss on every worker link,
checked with ping and iperf3, the check kept in every run's record); in
topology "service" the shards' host is behind the same kind of link at
WORKERS x the rate, in "same" each worker's namespace holds one of
WORKERS shards. Writes bench/results/peers_referee_<phase>.json (every run,
every row's targets, the per-cell table) and prints the table.
"""

from __future__ import annotations

import argparse
import fnmatch
import glob
import hashlib
import json
import math
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import referee
import summarize
from systems import SYSTEMS

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
PREFIX = "co2pr"
WORKERS = 4
SERVICE_ADDR = "10.99.0.100"
SHARDS = 2
CACHE = os.path.join(os.environ.get("CO2_CACHE_DIR", os.path.expanduser("~/.cache/co2")),
                     "peers-runs")
# co2 settings that run in the small model's sweep and its seed-1 rows at
# tau 16 only.
CO2_HEADLINE_ONLY = ("co2-nocarry", "co2-a0.5-carry", "co2-localsgd", "co2-by1",
                     "co2-boundary")
NEEDS = {"torchft-diloco": "torchft", "torchft-streaming": "torchft",
         "torchft-localsgd": "torchft", "hivemind": "hivemind"}


def worker_addr(i: int) -> str:
    return f"10.99.0.{i + 1}"


# The shared inner-lr sweep, one per model size: every system of that size's
# rows on its task at seed 1, tau 16, on the unshaped link, at each of the
# size's SWEEP_LRS; a system whose best lr is an edge of what it ran gets the
# next lr beyond it (halved or doubled, within SWEEP_BOUNDS) until its best
# lies inside. Every other row of the grid runs at its system's best for its
# size.
SWEEP_AT = {size: dict(size=size, steps=steps, link="none", tau=16, seed=1, val_windows=64,
                       eval_every=16)
            for size, steps in (("small", 256), ("medium", 128))}
# Where each size's sweep starts; the 25M model's a factor 4 lower, where a
# transformer of its size trains (the edge rule still finds a best outside).
SWEEP_LRS = {"small": (1e-3, 2e-3, 4e-3), "medium": (2.5e-4, 5e-4, 1e-3)}
SWEEP_BOUNDS = (6.25e-5, 3.2e-2)
# The no-communication reference only times the loop; its lr is fixed.
LOCAL_LR = 1e-3


def grid(quick: bool) -> list:
    """Every run of the grid, in the order they run: headline rows first.
    Rows of the full grid have lr None: their system's best from the sweep."""
    if quick:
        common = dict(size="tiny", steps=64, lr=3e-3, val_windows=32, eval_every=8)
        rows = [dict(common, system="local", link="none", tau=8, seed=1)]
        rows += [dict(common, system=s, link="100mbit", tau=8, seed=1, **co2_settings(s),
                      **peer_settings(s, "tiny", "100mbit"))
                 for s in SYSTEMS if s not in CO2_HEADLINE_ONLY]
        return rows
    rows = []

    def block(size, steps, links, taus, seed, headline=False):
        common = dict(size=size, steps=steps, lr=None, val_windows=64, eval_every=16, seed=seed)
        systems = [s for s in SYSTEMS
                   if s != "ddp" and (headline or s not in CO2_HEADLINE_ONLY)]
        out = [dict(common, system="local", link="none", tau=16, lr=LOCAL_LR)]
        for link in links:
            out.append(dict(common, system="ddp", link=link, tau=16))
            out += [dict(common, system=s, link=link, tau=tau, **co2_settings(s),
                         **peer_settings(s, size, link))
                    for tau in taus for s in systems]
        return out

    # Headline: the small model, unshaped and 100 Mbit/s, tau 16.
    rows += block("small", 256, ["none", "100mbit"], [16], 1, headline=True)
    rows += block("small", 256, ["1gbit"], [16], 1, headline=True)
    rows += block("small", 256, ["none", "100mbit", "1gbit"], [64], 1)
    for seed in (2, 3):
        rows += block("small", 256, ["none", "100mbit"], [16], seed)
    rows += block("medium", 128, ["none", "100mbit", "1gbit"], [16], 1)
    # tau 8 on the 25M model: twice the rounds, where a blocking exchange
    # costs LocalSGD most and co2 still hides its own.
    rows += block("medium", 128, ["100mbit"], [8], 1)
    seen, ordered = set(), []
    for r in rows:
        r["name"] = run_name(r)
        if r["name"] not in seen:
            seen.add(r["name"])
            ordered.append(r)
    return ordered


# task.py's model sizes, in parameters (task.count_parameters).
PARAMS = {"tiny": 135_168, "small": 3_307_264, "medium": 25_515_264}
# hivemind's quickstart's matchmaking_time and averaging_timeout, seconds.
HIVEMIND_MATCHMAKING_TIME = 3.0
HIVEMIND_AVERAGING_TIMEOUT = 10


def link_bytes_per_s(link: str) -> float:
    """A shaped link's rate (tc's syntax, as bench/overlap/netns.sh's
    ov_shape takes it) in bytes per second."""
    for unit, bits in (("gbit", 1e9), ("mbit", 1e6)):
        if link.endswith(unit):
            return float(link[:-len(unit)]) * bits / 8
    raise ValueError(f"not a shaped link: {link!r}")


def allreduce_s(size: str, link: str) -> float:
    """Seconds of one all-reduce of the fp32 model behind a shaped link: a
    ring or butterfly all-reduce moves 2(N - 1)/N of the model each way
    through each worker's link."""
    return 2 * (WORKERS - 1) / WORKERS * 4 * PARAMS[size] / link_bytes_per_s(link)


def peer_settings(system: str, size: str, link: str) -> dict:
    """What of a peer's settings the harness derives from the row, part of
    its cache key. hivemind's averaging_timeout is its quickstart's 10 s
    unless an all-reduce of the model takes longer behind the link: then
    "around 2x the actual time it takes to run all-reduce" (its
    Optimizer's docstring)."""
    if system != "hivemind" or link == "none":
        return {}
    timeout = math.ceil(2 * allreduce_s(size, link))
    return {"averaging_timeout": timeout} if timeout > HIVEMIND_AVERAGING_TIMEOUT else {}


def peer_args(r: dict) -> list:
    """The worker's flags for r's peer settings: hivemind's, the quickstart's
    where peer_settings gives none."""
    if r["system"] != "hivemind":
        return []
    return [f"--matchmaking_time={HIVEMIND_MATCHMAKING_TIME}",
            f"--averaging_timeout={r.get('averaging_timeout', HIVEMIND_AVERAGING_TIMEOUT)}"]


def knob_args(r: dict) -> list:
    """The worker's flags for a referee row's tuned knobs (budget.json)."""
    return [f"--{k}={r[k]}" for k in ("outer_lr", "outer_momentum", "fragments",
                                      "fragment_sync_delay") if k in r]


def co2_settings(system: str, curve: bool = True) -> dict:
    """What of co2's rows' settings the harness chooses, part of their cache
    key: when they apply each update (co2.Optimizer's default for co2: on
    arrival; co2-diloco, co2-localsgd and co2-boundary at the boundary), and,
    with `curve`, that the curve's points at round ends are the anchor at
    the step it took in the round's update (worker.py)."""
    if not system.startswith("co2"):
        return {}
    at_boundary = ("co2-diloco", "co2-localsgd", "co2-boundary")
    out = {"co2_apply": "boundary" if system in at_boundary else "arrival"}
    if curve:
        out["snapshot"] = "applied"
    return out


def run_name(r: dict) -> str:
    rep = f"-r{r['repeat']}" if r.get("repeat", 1) > 1 else ""
    if r["system"] == "local":
        return f"{r['size']}-local-seed{r['seed']}{rep}"
    tau = "" if r["system"] == "ddp" else f"-tau{r['tau']}"
    return f"{r['size']}-{r['link']}{tau}-seed{r['seed']}-{r['system']}{rep}"


def repeat_of(row: dict, k: int) -> dict:
    """The grid row `row`'s settings, run again as repeat k (named ...-rK)."""
    x = {key: v for key, v in row.items() if key != "name"}
    x["repeat"] = k
    x["name"] = run_name(x)
    return x


def cached_repeats(rows: list, cache: str) -> list:
    """The repeats of `rows` that earlier invocations ran: each a grid row's
    settings as that repeat, so that the cache serves the run of those
    settings (a repeat cached under settings the grid no longer has is not
    one of its rows)."""
    grid_rows = {r["name"]: r for r in rows if r.get("repeat", 1) == 1}
    known = {r["name"] for r in rows}
    out = []
    for path in sorted(glob.glob(os.path.join(cache, "*.json"))):
        with open(path) as f:
            run = json.load(f)["run"]
        base = grid_rows.get(run_name(dict(run, repeat=1)))
        if run.get("repeat", 1) > 1 and base is not None:
            x = repeat_of(base, run["repeat"])
            if x["name"] not in known:
                out.append(x)
                known.add(x["name"])
    return out


def recorded_repeats(rows: list, repeats: list, only: list, cache: str) -> list:
    """`rows` without those of `repeats` (found by cached_repeats) that the
    cache has no run of at the lr the sweep gives them now, unless --only
    names them: a repeat run at an lr the sweep no longer picks is not one of
    the rows."""
    return [r for r in rows if r not in repeats or named(r["name"], only)
            or any(cache_files(cache, r, failed) for failed in (False, True))]


def named(name: str, patterns: list) -> bool:
    """Whether --only's patterns name the run `name`."""
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def job_id(name: str) -> str:
    """The run's name as a job id every system takes (hivemind's run_id may
    not hold a '.', which an lr in a sweep row's name has)."""
    return name.replace(".", "_")


def sh(cmd: str, check: bool = True) -> str:
    p = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120)
    if check and p.returncode != 0:
        raise RuntimeError(f"{cmd!r} failed ({p.returncode}): {p.stderr[-2000:]}")
    return p.stdout


def netns(cmd: str) -> str:
    return sh(f"OV_PREFIX={PREFIX}; source {ROOT}/bench/overlap/netns.sh; {cmd}")


def shape(link: str) -> None:
    if link == "none":
        for i in range(WORKERS):
            sh(f"ip netns exec {PREFIX}-w{i} tc qdisc del dev eth0 root", check=False)
            sh(f"ip netns exec {PREFIX}-sw tc qdisc del dev p{i} root", check=False)
    else:
        netns(f"ov_shape {WORKERS} {link}")


LINKEM = os.environ.get("OV_LINKEM", os.path.join(ROOT, "build", "bin", "co2-linkem"))


def referee_link(r: dict, scratch: str) -> dict:
    """Sets up a referee row's link and returns ov_link's self-check (what
    was asked and measured), or, on the unshaped link, that nothing was
    shaped. Every worker link gets the cell's rate, RTT and loss
    (bench/overlap/netns.sh's ov_link); in topology "service" the service
    host's link is shaped too, at WORKERS x the rate (its delay and loss
    are ov_delay's, on every host); in "same" it stays unshaped and idle."""
    netns("ov_undelay")
    sh(f"ip netns exec {PREFIX}-agg tc qdisc del dev eth0 root", check=False)
    sh(f"ip netns exec {PREFIX}-sw tc qdisc del dev pa root", check=False)
    if r["link"] == "none" and not r["rtt_ms"] and not r["loss"]:
        shape("none")
        return {"asked": {"rate": "none", "rtt_ms": 0, "loss": 0}, "measured": None}
    if r["link"] == "none":
        raise ValueError("a referee cell with delay or loss needs a rate")
    if r["topology"] == "service":
        rate = f"{round(WORKERS * link_bytes_per_s(r['link']) * 8 / 1e6)}mbit"
        burst = max(131072, int(WORKERS * link_bytes_per_s(r["link"]) / 250))
        for ns, dev in ((f"{PREFIX}-agg", "eth0"), (f"{PREFIX}-sw", "pa")):
            sh(f"ip netns exec {ns} tc qdisc replace dev {dev} root tbf rate {rate} "
               f"burst {burst} latency 50ms")
    out = os.path.join(scratch, "link.json")
    log = os.path.join(scratch, "ov_link.log")
    # The emulators it starts outlive the shell: their output goes to the
    # log, not to the pipe sh() reads until it closes.
    try:
        netns(f"OV_LINKEM={shlex.quote(LINKEM)}; OV_LINKEM_DIR={shlex.quote(scratch)}; "
              f"ov_link {WORKERS} {r['link']} {r['rtt_ms']:g} {r['loss']:g} default {out} "
              f">{shlex.quote(log)} 2>&1")
    except RuntimeError as e:
        raise RuntimeError(f"{e}; ov_link says: {tail(log)}") from None
    with open(out) as f:
        check = json.load(f)
    check["topology"] = r["topology"]
    if r["topology"] == "service":
        check["service_link"] = {"rate_mbit": WORKERS * link_bytes_per_s(r["link"]) * 8 / 1e6}
    return check


def iface_counters() -> dict:
    """tx/rx bytes of every host's eth0: each worker's link and the
    service host's (every byte crosses the links of its sender and its
    receiver, so the sum over links counts it on each)."""
    out = {}
    for ns in [f"{PREFIX}-w{i}" for i in range(WORKERS)] + [f"{PREFIX}-agg"]:
        text = sh(f"ip netns exec {ns} cat /sys/class/net/eth0/statistics/tx_bytes "
                  f"/sys/class/net/eth0/statistics/rx_bytes")
        tx, rx = (int(v) for v in text.split())
        out[ns] = {"tx_bytes": tx, "rx_bytes": rx}
    return out


def wait_listening(port: int, deadline_s: float, ns: str = f"{PREFIX}-agg") -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if f":{port} " in sh(f"ip netns exec {ns} ss -Hltn"):
            return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listens on port {port} in {ns} after {deadline_s} s")


class Services:
    """The run's services, stopped on exit: in the service namespace
    (topology "service"), or (topology "same") co2's WORKERS shards one in
    each worker's namespace and the lighthouse / hivemind's first peer in
    worker 0's."""

    def __init__(self, system: str, python: str, limit: int, scratch: str,
                 topology: str = "service", params: int = 0) -> None:
        self.system, self.python, self.limit, self.scratch = system, python, limit, scratch
        self.topology = topology
        self.procs = []
        self.worker_args = []
        same = topology == "same"
        self.ns = f"{PREFIX}-w0" if same else f"{PREFIX}-agg"
        self.addr = worker_addr(0) if same else SERVICE_ADDR
        # co2 gives every shard at least one block of 65,536 parameters: a
        # model with fewer blocks than workers (the tiny one: 3) gets one
        # shard on each of the first workers.
        same_shards = min(WORKERS, max(1, -(-params // 65536))) if params else WORKERS
        self.shards = [(f"{PREFIX}-w{s}", worker_addr(s), 50051 + s)
                       for s in range(same_shards)] \
            if same else [(f"{PREFIX}-agg", SERVICE_ADDR, 50051 + s) for s in range(SHARDS)]

    def _start(self, argv: list, name: str, stdin=None, ns: str = "") -> subprocess.Popen:
        log = open(os.path.join(self.scratch, f"{name}.log"), "w")
        p = subprocess.Popen(["ip", "netns", "exec", ns or self.ns, "timeout",
                              str(self.limit)] + argv, stdout=log, stderr=subprocess.STDOUT,
                             stdin=stdin, start_new_session=True)
        self.procs.append(p)
        return p

    def __enter__(self) -> "Services":
        bindir = os.path.dirname(self.python)
        if self.system.startswith("co2"):
            binary = subprocess.run([os.path.join(bindir, "co2"), "aggregator-path"], check=True,
                                    capture_output=True, text=True, timeout=60).stdout.strip()
            n = len(self.shards)
            for s, (ns, _, port) in enumerate(self.shards):
                self._start([binary, "--insecure", f"--port={port}", f"--shard_index={s}",
                             f"--num_shards={n}", "--metrics_port=-1"], f"shard-{s}", ns=ns)
            for ns, _, port in self.shards:
                wait_listening(port, 30, ns)
            self.worker_args = ["--aggregators=" + ",".join(
                f"{addr}:{port}" for _, addr, port in self.shards)]
        elif self.system.startswith("torchft"):
            self._start([os.path.join(bindir, "torchft_lighthouse"), "--min_replicas",
                         str(WORKERS), "--bind", "0.0.0.0:29510"], "lighthouse")
            wait_listening(29510, 30, self.ns)
        elif self.system == "hivemind":
            maddr = os.path.join(self.scratch, "maddr")
            self._start([self.python, os.path.join(HERE, "hivemind_peer.py"), self.addr,
                         maddr], "hivemind-peer", stdin=subprocess.PIPE)
            end = time.monotonic() + 60
            while not os.path.exists(maddr):
                if time.monotonic() > end or self.procs[-1].poll() is not None:
                    raise RuntimeError("hivemind's first peer did not start: " + tail(
                        os.path.join(self.scratch, "hivemind-peer.log")))
                time.sleep(0.1)
            with open(maddr) as f:
                self.worker_args = ["--initial_peer=" + f.read().strip()]
        return self

    def __exit__(self, *exc) -> None:
        for p in self.procs:
            if p.stdin:
                p.stdin.close()
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=20)


def tail(path: str, n: int = 3000) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()[-n:]
    except FileNotFoundError:
        return ""


def limit_s(r: dict) -> int:
    """Each worker's time limit: room for the row's compute on these cores,
    and for DDP behind a shaped link also its all-reduce of the whole model
    every step (on the 25M model behind 100 Mbit/s, 153 MB per worker and
    step, 12 s at 12.5 MB/s: 26 min for its 128 steps)."""
    limit = {"tiny": 240, "small": 900, "medium": 1500}[r["size"]]
    if r["system"] == "ddp" and r["link"] != "none":
        limit += math.ceil(r["steps"] * allreduce_s(r["size"], r["link"]))
    return limit


def wait_for_workers(procs: list, limit: int, scratch: str) -> list:
    """Waits for every worker; the first to fail, whichever it is, ends the
    run (the others would wait for it until their deadline). Returns what
    failed, empty when all exited 0."""
    deadline = time.monotonic() + limit + 30
    pending = dict(enumerate(procs))
    failed = []
    try:
        while pending and not failed:
            for i, p in list(pending.items()):
                rc = p.poll()
                if rc is None:
                    continue
                del pending[i]
                if rc != 0:
                    # timeout(1) exits 124 when the worker ran past its limit.
                    why = f"ran past its {limit} s limit" if rc == 124 else f"exited {rc}"
                    failed.append(f"worker {i} {why}: " + tail(f"{scratch}/w{i}.log"))
                    break
            if pending and not failed:
                if time.monotonic() > deadline:
                    failed.append(f"workers {sorted(pending)} outlived their {limit} s limit")
                else:
                    time.sleep(0.2)
    finally:
        # Also when the run is stopped (SIGTERM) while they train.
        for p in pending.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=30)
    return failed


def one_run(r: dict, python: str, limit: int) -> dict:
    """Runs r's four workers (and its services); returns the record."""
    with tempfile.TemporaryDirectory(prefix="co2-peers-") as scratch:
        if os.environ.get("KEEP") == "1":
            scratch = tempfile.mkdtemp(prefix="co2-peers-kept-")
            print(f"  keeping {scratch}", file=sys.stderr)
        with Services(r["system"], python, limit, scratch, r.get("topology", "service"),
                      PARAMS[r["size"]]) as services:
            before = iface_counters()
            procs, commands = [], []
            for i in range(WORKERS):
                argv = [python, os.path.join(HERE, "worker.py"),
                        f"--system={r.get('variant', r['system'])}",
                        f"--rank={i}", f"--workers={WORKERS}", f"--size={r['size']}",
                        f"--steps={r['steps']}", f"--tau={r['tau']}", f"--lr={r['lr']}",
                        f"--seed={r['seed']}", f"--eval_every={r['eval_every']}",
                        f"--val_windows={r['val_windows']}", f"--addr={worker_addr(i)}",
                        f"--rank0_addr={worker_addr(0)}", f"--service_addr={services.addr}",
                        f"--job={job_id(r['name'])}", f"--out={scratch}/rank-{i}.json"]
                argv += peer_args(r) + services.worker_args + knob_args(r)
                commands.append(shlex.join(argv))
                log = open(os.path.join(scratch, f"w{i}.log"), "w")
                procs.append(subprocess.Popen(
                    ["ip", "netns", "exec", f"{PREFIX}-w{i}", "timeout", str(limit)] + argv,
                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                    env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")))
            failed = wait_for_workers(procs, limit, scratch)
            after = iface_counters()
        if failed:
            return {"run": r, "error": failed[0], "commands": commands}
        ranks = []
        for i in range(WORKERS):
            with open(f"{scratch}/rank-{i}.json") as f:
                ranks.append(json.load(f))
    wire = {ns: {k: after[ns][k] - before[ns][k] for k in after[ns]} for ns in after}
    rec = {"run": r, "ranks": ranks, "wire": wire, "commands": commands,
           "services": {"topology": r.get("topology", "service"), "ns": services.ns,
                        "shards": [f"{ns} {addr}:{port}" for ns, addr, port in services.shards]
                        if r["system"].startswith("co2") else []}}
    digests = {x["params_digest"] for x in ranks}
    # DDP keeps the replicas equal every step, co2's finish() ends every
    # worker on the shards' final anchor: anything else is a wrong run.
    if len(digests) > 1 and (r["system"] == "ddp" or r["system"].startswith("co2")):
        rec["error"] = f"{r['system']}: the workers ended on different parameters {digests}"
    return rec


def head_commit() -> str:
    p = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True)
    return p.stdout.strip() or "unknown"


def cache_key(r: dict) -> str:
    """The run's settings, not its name: a sweep row and a grid row with the
    same settings are one run."""
    settings = {k: v for k, v in r.items() if k != "name"}
    return hashlib.sha1(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:10]


# A cached record's file ends in its settings' key and this: a finished
# run, or (True) the last failed run of those settings.
RECORD_SUFFIX = {False: ".json", True: ".failed.json"}


def cache_path(cache: str, r: dict, failed: bool = False) -> str:
    """Where the cache keeps r's record (see RECORD_SUFFIX)."""
    return os.path.join(cache, f"{r['name']}-{cache_key(r)}{RECORD_SUFFIX[failed]}")


def cache_files(cache: str, r: dict, failed: bool = False) -> list:
    """The cache's records of r's settings, under any name (a sweep row and a
    grid row with the same settings are one run)."""
    return glob.glob(os.path.join(cache, f"*-{cache_key(r)}{RECORD_SUFFIX[failed]}"))


def cached(cache: str, r: dict, failed: bool = False):
    """The cached record of r's settings (under r's name), or None; with
    `failed`, the record of their last failed run."""
    for path in cache_files(cache, r, failed):
        with open(path) as f:
            rec = json.load(f)
        rec["run"] = dict(r)
        return rec
    return None


def store(path: str, rec: dict) -> None:
    """Writes a cache record whole or not at all."""
    with open(path + ".part", "w") as f:
        json.dump(rec, f)
    os.replace(path + ".part", path)


def sweep_row(size: str, system: str, lr: float) -> dict:
    """The sweep reads only the final loss: its rows carry no curve setting."""
    r = dict(SWEEP_AT[size], system=system, lr=lr, **co2_settings(system, curve=False),
             **peer_settings(system, size, SWEEP_AT[size]["link"]))
    r["name"] = f"{run_name(r)}-lr{lr:g}"
    return r


class Runner:
    """Runs rows (or takes them from the cache) into self.records; a row it
    may not start is its last failed run's record where the cache has one,
    and goes to self.not_run where it has none. A failed row that is
    selected runs again."""

    def __init__(self, args, python: str, installed: dict) -> None:
        self.args, self.python, self.installed = args, python, installed
        self.records, self.not_run = {}, []
        # The rows this invocation ran and saw fail, and those whose failed
        # run an earlier invocation cached.
        self.failed, self.failed_earlier = [], []
        self.cpu = machine()["cpu"]
        self.started = time.monotonic()
        self.current_link = None
        self.link_check = None
        self.scratch = None  # ov_link's self-check and emulator stats, made on first use
        self.step_s = referee.cached_step_s() if os.path.exists(referee.TIMINGS) else {}

    def run(self, r: dict, selected: bool = True):
        rec = cached(self.args.cache, r)
        if rec is not None:
            self.records[r["name"]] = rec
            return rec
        need = NEEDS.get(r["system"])
        if need and self.installed.get(need, {}).get("status") != "ok":
            rec = {"run": r, "error": f"{need} is not installed: "
                   + self.installed.get(need, {}).get("error", "")}
            self.records[r["name"]] = rec
            return rec
        if not selected or r["lr"] is None or (
                self.args.max_minutes
                and time.monotonic() - self.started > 60 * self.args.max_minutes):
            rec = cached(self.args.cache, r, failed=True)
            if rec is None:
                self.not_run.append(r["name"])
                return None
            self.failed_earlier.append(r["name"])
            self.records[r["name"]] = rec
            return rec
        if r.get("referee"):
            key = (r["link"], r["rtt_ms"], r["loss"], r["topology"])
            if key != self.current_link:
                self.scratch = self.scratch or tempfile.mkdtemp(prefix="co2-peers-link-")
                self.link_check = referee_link(r, self.scratch)
                self.current_link = key
            limit = math.ceil(2 * referee.estimate_s(r, self.step_s)) + 300
        else:
            if r["link"] != self.current_link:
                shape(r["link"])
                self.current_link = r["link"]
            limit = limit_s(r)
        print(f"run {r['name']}", file=sys.stderr, flush=True)
        t = time.monotonic()
        load = os.getloadavg()[0]
        rec = one_run(r, self.python, limit)
        rec["elapsed_s"] = time.monotonic() - t
        # The machine is shared: its 1-minute load before and after the run.
        rec["load_1min"] = [load, os.getloadavg()[0]]
        rec["commit"] = head_commit()
        rec["cpu"] = self.cpu
        if r.get("referee"):
            rec["link_check"] = self.link_check
        if "error" in rec:
            print(f"  FAILED: {summarize.failure(rec['error'])}; its log ends: "
                  f"{rec['error'][-1500:]}", file=sys.stderr, flush=True)
            store(cache_path(self.args.cache, r, failed=True), rec)
            self.failed.append(r["name"])
        else:
            print(f"  done in {rec['elapsed_s']:.0f} s, final val loss "
                  f"{rec['ranks'][0]['final_val_loss']:.4f}", file=sys.stderr, flush=True)
            store(cache_path(self.args.cache, r), rec)
            for path in cache_files(self.args.cache, r, failed=True):
                os.remove(path)
        self.records[r["name"]] = rec
        return rec


def final_loss(rec) -> float:
    """A run's final loss for the sweep: a failed or diverged run is +inf."""
    if rec is None or "error" in rec:
        return math.inf
    loss = rec["ranks"][0]["final_val_loss"]
    return loss if math.isfinite(loss) else math.inf


def sweep(runner: Runner, size: str, systems: list, needed: set) -> dict:
    """The shared inner-lr sweep of `systems` on the model `size`, run where
    a system is `needed` and taken from the cache for the others; per system
    the lrs it ran with their final losses (failed runs with their error)
    and the best lr, None while the sweep is incomplete."""
    out = {}
    for system in systems:
        lrs = list(SWEEP_LRS[size])
        while True:
            recs = {lr: runner.run(sweep_row(size, system, lr), system in needed)
                    for lr in lrs}
            losses = {lr: final_loss(rec) for lr, rec in recs.items()}
            best = None
            if all(rec is not None for rec in recs.values()):
                best = min(lrs, key=lambda lr: losses[lr])
                if math.isinf(losses[best]):
                    best = None
                elif best == lrs[0] and best / 2 >= SWEEP_BOUNDS[0]:
                    lrs.insert(0, best / 2)
                    continue
                elif best == lrs[-1] and best * 2 <= SWEEP_BOUNDS[1]:
                    lrs.append(best * 2)
                    continue
            break
        out[system] = {"best_lr": best,
                       "runs": [sweep_entry(size, system, lr, recs[lr]) for lr in lrs]}
    return out


def sweep_systems(rows: list, size: str) -> list:
    """The systems whose rows of the model `size` take their lr from its sweep."""
    return [s for s in SYSTEMS
            if any(r["size"] == size and r["system"] == s and r["lr"] is None for r in rows)]


def take_best(rows: list, lr_sweep: dict) -> None:
    """Gives each row whose lr the sweep decides (None) its system's best lr
    for the row's model size."""
    for r in rows:
        if r["lr"] is None and r["system"] in lr_sweep.get(r["size"], {}):
            r["lr"] = lr_sweep[r["size"]][r["system"]]["best_lr"]


def sweep_entry(size: str, system: str, lr: float, rec) -> dict:
    """One lr of a system's sweep as the results record it."""
    entry = {"lr": lr, "name": sweep_row(size, system, lr)["name"], "final_val_loss": None}
    if rec is None:
        entry["not_run"] = True
    elif "error" in rec:
        entry["error"] = rec["error"][-500:]
    else:
        entry["final_val_loss"] = rec["ranks"][0]["final_val_loss"]
    return entry


def versions(python: str) -> dict:
    code = ("import json, importlib.metadata as m, sys\n"
            "out = {'python': sys.version.split()[0]}\n"
            "for d in ('torch', 'numpy', 'torchft', 'hivemind', 'co2'):\n"
            "    try: out[d] = m.version(d)\n"
            "    except m.PackageNotFoundError: out[d] = None\n"
            "print(json.dumps(out))")
    return json.loads(subprocess.run([python, "-c", code], check=True, capture_output=True,
                                     text=True, timeout=120).stdout)


def install_status(python: str) -> dict:
    """What bench/peers/venv.sh recorded about each peer's pip install."""
    venv = os.path.dirname(os.path.dirname(python))
    out = {}
    with open(os.path.join(venv, "peers.status")) as f:
        for line in f:
            pin, status = line.split()
            name = pin.split("==")[0]
            out[name] = {"pin": pin, "status": status}
            if status != "ok":
                out[name]["error"] = tail(os.path.join(venv, f"pip-{name}.log"), 4000)
    return out


def machine() -> dict:
    cpu = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {"cpu": cpu, "cores": os.cpu_count(), "kernel": platform.release(),
            "os": platform.freedesktop_os_release().get("PRETTY_NAME", ""),
            "load_at_start": os.getloadavg()}


def stopped(*_) -> None:
    print("bench/peers/run.py: stopped; the run in progress is not cached, the "
          "cached ones stay", file=sys.stderr, flush=True)
    sys.exit(143)


def own_session() -> None:
    """Re-runs this script in its own session, whose scheduler autogroup
    gets nice -10, as bench/overlap/netns.sh's ov_own_session does: other
    sessions' builds would otherwise take the CPU the workers are timed on."""
    if os.environ.get("CO2_PEERS_SESSION"):
        try:
            with open("/proc/self/autogroup", "w") as f:
                f.write("-10")
        except OSError:
            pass
        return
    env = dict(os.environ, CO2_PEERS_SESSION="1")
    run = subprocess.Popen(["setsid", "-w", sys.executable] + sys.argv, env=env)

    # Ctrl-C and kill reach this process, not the run's session: pass them
    # on as SIGTERM, which ends the run where it is (its workers, services
    # and namespaces go, the run in progress is not cached).
    def stop(*_):
        run.send_signal(signal.SIGTERM)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)
    sys.exit(run.wait())


def referee_rows(args, budget: dict) -> list:
    """The rows of --referee PHASE (referee.py), named, in run order."""
    phases = ["select", "headline", "loss"] if args.referee == "all" else [args.referee]
    rows = []
    if args.referee == "smoke":
        systems = [x for x in args.systems.split(",") if x]
        settings = {x: dict(budget["systems"][x]["settings"][0], lr=3e-3, tau=8)
                    for x in referee.SYSTEMS}
        kw = dict(size="tiny", steps=32, eval_every=8, val_windows=0)
        rows = referee.phase_rows(settings, "smoke", (("100mbit", 50, 0.0),), (1,),
                                  systems=tuple(systems), **kw)
        rows = [r for r in rows if r["system"] in systems]
        phases = []
    for phase in phases:
        if phase == "select":
            rows += referee.select_rows(budget)
            continue
        if os.path.exists(args.frozen):
            with open(args.frozen) as f:
                settings = referee.frozen_settings(budget, json.load(f))
        elif args.plan:  # the cost does not depend on which setting is picked much
            settings = {x: budget["systems"][x]["settings"][0] for x in referee.SYSTEMS}
        else:
            raise SystemExit(f"no {args.frozen}: run --referee select first")
        if phase == "headline":
            out = referee.phase_rows(settings, phase, referee.HEADLINE_CELLS,
                                     referee.HEADLINE_SEEDS)
        else:
            out = referee.phase_rows(settings, phase, (referee.LOSS_CELL,), referee.LOSS_SEEDS,
                                     systems=referee.LOSS_SYSTEMS)
        referee.cut_steps(out, referee.cached_step_s())
        rows += out
    for r in rows:
        r["name"] = referee.row_name(r)
    return rows


def print_plan(rows: list) -> None:
    p = referee.plan(rows, referee.cached_step_s())
    for x in p["runs"]:
        print(f"{x['name']:64} {x['phase']:8} {x['steps']:5} steps {x['estimate_s'] / 60:6.1f} min")
    for phase, t in p["by_phase_s"].items():
        print(f"{phase}: {sum(1 for x in p['runs'] if x['phase'] == phase)} runs, {t / 3600:.2f} h")
    print(f"{len(p['runs'])} runs and {p['link_setups']} link set-ups: "
          f"{p['total_s'] / 3600:.1f} h on this machine (estimates: bench/results/peers.json's "
          f"per-step times, referee.py's RTT, evaluation and overhead terms)")


def freeze(budget: dict, rows: list, records: dict, path: str) -> dict:
    """Picks each system's setting from the select rows' final losses and
    writes the frozen file."""
    losses = {}
    for r in rows:
        rec = records.get(r["name"])
        loss = None if rec is None or "error" in rec else rec["ranks"][0]["final_val_loss"]
        losses.setdefault(r["system"], {})[r["setting"]] = loss
    picked = referee.pick(budget, losses)
    with open(referee.BUDGET, "rb") as f:
        digest = hashlib.sha1(f.read()).hexdigest()
    doc = {"what": "each system's setting for every headline and loss-cell run (run.py "
                   "--referee select; bench/peers/budget.json)", "rule": budget["rule"],
           "budget_sha1": digest, "commit": head_commit(), "picked": picked, "losses": losses}
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"wrote {path}: " + ", ".join(f"{k} {v}" for k, v in picked.items()), file=sys.stderr)
    return doc


def referee_main(args, python: str) -> int:
    budget = referee.load_budget()
    rows = referee_rows(args, budget)
    installed = install_status(python)
    runner = Runner(args, python, installed)
    os.makedirs(args.cache, exist_ok=True)
    netns("ov_down")
    netns(f"ov_up {WORKERS}")
    try:
        for r in rows:
            runner.run(r)
    finally:
        netns("ov_down")
        if runner.scratch and os.environ.get("KEEP") != "1":
            shutil.rmtree(runner.scratch, ignore_errors=True)
    if args.referee in ("select", "all"):
        freeze(budget, [r for r in rows if r["phase"] == "select"], runner.records, args.frozen)
    out = args.out or os.path.join(ROOT, "bench", "results", f"peers_referee_{args.referee}.json")
    result = summarize.referee_build(runner.records, rows, versions=versions(python),
                                     installed=installed, machine=machine(),
                                     orders={s: referee.order(s) for s in
                                             sorted({r["seed"] for r in rows})})
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    print(f"wrote {out}", file=sys.stderr)
    summarize.print_referee(result)
    return 1 if runner.failed else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--referee", choices=("select", "headline", "loss", "all", "smoke"),
                    help="issue 63's campaign (referee.py): the tuning budget's select step, "
                         "the headline cells, the loss cell, all three in order, or a "
                         "tiny smoke of one cell (100 Mbit/s, 50 ms) in both topologies")
    ap.add_argument("--plan", action="store_true",
                    help="with --referee: list every run with its estimated time and the total")
    ap.add_argument("--frozen", default=referee.FROZEN,
                    help="the frozen settings --referee select writes and the others read")
    ap.add_argument("--systems", default="co2,ddp", help="--referee smoke's systems")
    ap.add_argument("--quick", action="store_true", help="the tiny model at 100 Mbit/s only")
    ap.add_argument("--only", default="",
                    help="comma-separated run names or shell-style patterns of them")
    ap.add_argument("--max_minutes", type=float, default=0,
                    help="start no run after this many minutes (0: no bound)")
    ap.add_argument("--out", default="")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run the selected rows again as repeat K (rows named ...-rK)")
    ap.add_argument("--cache", default=CACHE, help="the directory of cached runs")
    ap.add_argument("--python", default="", help="the venv's python (default: bench/peers/venv.sh)")
    args = ap.parse_args()
    if args.plan:
        if not args.referee:
            ap.error("--plan goes with --referee")
        print_plan(referee_rows(args, referee.load_budget()))
        return 0
    if os.geteuid() != 0:
        print("bench/peers/run.py needs root (network namespaces and tc)", file=sys.stderr)
        return 2
    own_session()
    # SIGTERM unwinds like an exception, so that the namespaces (and every
    # process left in them) go.
    signal.signal(signal.SIGTERM, stopped)
    out = args.out or os.path.join(ROOT, "bench", "results",
                                   "peers_quick.json" if args.quick else "peers.json")
    python = args.python or subprocess.run(
        [os.path.join(HERE, "venv.sh")], check=True, capture_output=True, text=True,
        timeout=3600).stdout.strip().splitlines()[-1]
    if args.referee:
        return referee_main(args, python)
    vers = versions(python)
    installed = install_status(python)
    rows = grid(args.quick)
    for r in rows:
        r.setdefault("name", run_name(r))
    if args.repeat > 1:
        # Repeats of the selected rows, after the grid, under their own names.
        only = [p for p in args.only.split(",") if p]
        chosen = [r for r in rows if named(r["name"], only)]
        keys = {(r["size"], r["seed"]) for r in chosen}
        chosen += [r for r in rows if r["system"] == "local" and (r["size"], r["seed"]) in keys
                   and r not in chosen]
        extra = [repeat_of(r, args.repeat) for r in chosen]
        rows += extra
        args.only = ",".join(x["name"] for x in extra)
    repeats = cached_repeats(rows, args.cache)
    rows += repeats
    only = [p for p in args.only.split(",") if p]
    selected = [r for r in rows if not only or named(r["name"], only)]
    os.makedirs(args.cache, exist_ok=True)
    runner = Runner(args, python, installed)
    lr_sweep = {}
    netns("ov_down")
    netns(f"ov_up {WORKERS}")
    try:
        if not args.quick:
            # Each size's sweep comes first for every system a selected row
            # of that size needs; the other systems' rows are read from the
            # cache at their best.
            for size in SWEEP_AT:
                needed = {r["system"] for r in selected if r["lr"] is None and r["size"] == size}
                lr_sweep[size] = sweep(runner, size, sweep_systems(rows, size), needed)
            take_best(rows, lr_sweep)
            rows = recorded_repeats(rows, repeats, only, args.cache)
        for r in rows:
            runner.run(r, r in selected)
    finally:
        netns("ov_down")
    records, not_run = runner.records, runner.not_run
    command = "sudo python3 bench/peers/run.py" + (" --quick" if args.quick else "")
    invocation = shlex.join(["python3", "bench/peers/run.py"] + sys.argv[1:])
    result = summarize.build(records, rows, not_run, command=command, versions=vers,
                             installed=installed, machine=machine(), quick=args.quick)
    result["lr_sweep"] = {size: {"at": SWEEP_AT[size], "grid": SWEEP_LRS[size],
                                 "bounds": SWEEP_BOUNDS, "systems": systems}
                          for size, systems in lr_sweep.items()}
    result["this_invocation"] = invocation
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    print(f"wrote {out}", file=sys.stderr)
    if not args.quick:
        summarize.plot(result, os.path.splitext(out)[0] + ".png")
        summarize.plot(result, os.path.splitext(out)[0] + "-medium.png", size="medium")
    summarize.print_table(result)
    if runner.failed_earlier:
        print("failed in an earlier invocation (--only NAME runs it again): "
              + ", ".join(runner.failed_earlier), file=sys.stderr)
    if runner.failed:
        print("FAILED runs: " + ", ".join(runner.failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
