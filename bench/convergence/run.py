#!/usr/bin/python3
"""Convergence study: CO2 against DDP, DiLoCo and Local-SGD, with ablations.

One command runs every configuration of the study with co2-train (4 workers,
fixed seeds, the same number of inner steps, hence samples, per algorithm),
then writes
  bench/results/convergence.json   every run: command, final metrics, curve
  bench/results/convergence_*.png  validation metric against samples seen
  docs/results/convergence.md      the table between its convergence markers
Runs are cached in --work (one report per run id), so an interrupted study
resumes where it stopped. Standard library only (Debian's python3); gnuplot
draws the plots.

  bench/convergence/run.py                 # the full study (about 70 min, 2 cores)
  bench/convergence/run.py --quick         # smoke test (about 1 min)
  bench/convergence/run.py --only 'fashion-mnist/tau12/'  # a subset
  bench/convergence/run.py --only 'charlm/tau48/diloco/seed1' --lrs 4e-3,1.6e-2
                                           # an inner-lr sweep of those runs
"""
import argparse
import json
import math
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKERS = 4

# Per task: steps of the full study (a multiple of every τ, and at least 20
# rounds at τ = 128), batch, eval sizes, the metric the table reports, the
# inner AdamW learning rates, and which variants run: `seeded` with every
# seed at every τ (ddp, which has no rounds, at the first τ only), `best_co2`
# (τ → the co2 variant best on seed 1 at that τ, in the table) also with
# every seed at that τ, `single` with the first seed at every τ, `ablations`
# with the first seed at the first τ. charlm trains on short windows (8 × 16
# bytes per step): the cost of co2's one-round-stale anchor is per round, so
# the LSTM gets many rounds for few bytes.
#
# Learning rates (seed 1 sweeps, docs/results/convergence.md): "base" is DDP's best and
# ddp, localsgd and slowmo use it; "co2" is co2's best; "diloco" is
# DiLoCo's. co2 halves the outer step (α = 0.5, docs/outer-settings.md), so its
# best inner lr is larger; DiLoCo's Nesterov outer step (α = 0.7, β = 0.9)
# amplifies the round's delta, so its best is smaller.
# Fashion-MNIST, ddp at 1 epoch: 85.5 % at 1e-3, 86.3 % at 2e-3, 86.2 % at
# 3e-3; at batch 16 and 2 epochs (seed 1) 87.43 % at 1e-3, 87.78 % at 2e-3,
# 87.44 % at 3e-3. co2 (batch 32, 2 epochs): 87.57 % at 4e-3, 87.60 % at
# 6e-3, 87.29 % at 8e-3. Fashion-MNIST trains on batches of 16 for the same
# reason as charlm's short windows: twice the rounds for the same samples.
# charlm, ddp: 2.205 at 4e-3, 2.176 at 8e-3, 2.184 at 1.6e-2; co2: 2.187 at
# 1.6e-2, 2.163 at 3.2e-2, 2.203 at 6.4e-2.
# diloco, at the study's own steps and flags, τ = 48, seed 1 (run.py --lrs,
# bench/results/convergence_lr_sweep.json): Fashion-MNIST 88.84 % at
# 2.5e-4, 89.55 % at 5e-4, 89.35 % at 1e-3, 89.18 % at 2e-3, 87.02 % at
# 4e-3; charlm 2.2260 at 1e-3, 2.1512 at 2e-3, 2.1517 at 4e-3, 2.1733 at
# 8e-3, 2.2500 at 1.6e-2.
TASKS = {
    "fashion-mnist": dict(steps=3072, quick_steps=48, batch=16,
                          flags=["--eval_examples=1000", "--final_eval_examples=0"],
                          metric="test_accuracy", curve="metric",
                          higher_better=True,
                          lr=dict(base=2e-3, co2=4e-3, diloco=5e-4),
                          seeded=["ddp", "diloco", "co2-eager"],
                          best_co2={12: "co2-eager-dn", 48: "co2-eager",
                                    128: "co2-eager-a0.5"},
                          single=["localsgd", "co2", "co2-eager-a0.5", "co2-dn",
                                  "co2-eager-dn"],
                          ablations=["slowmo", "co2-penalty", "co2-clip",
                                     "co2-int8", "co2-base-lr"]),
    "charlm": dict(steps=2688, quick_steps=96, batch=8,
                   flags=["--seq_len=16", "--eval_examples=200",
                          "--final_eval_examples=1000"],
                   metric="val_loss", curve="eval_loss",
                   higher_better=False,
                   lr=dict(base=8e-3, co2=3.2e-2, diloco=2e-3),
                   seeded=["ddp", "diloco", "co2-eager"],
                   best_co2={12: "co2", 48: "co2-eager-a0.5",
                             128: "co2-eager-a0.5"},
                   single=["localsgd", "co2", "co2-eager-a0.5", "co2-dn",
                           "co2-eager-dn"],
                   ablations=["slowmo", "co2-penalty", "co2-clip", "co2-int8"]),
}

# The outer step every co2 run starts from (α = 0.5 without carried progress,
# pinned so that a row means the same thing whatever the flag defaults are);
# a variant's flags override them (absl: the last occurrence wins).
CO2_OUTER = ["--alpha=0.5", "--beta=0", "--momentum=heavy_ball",
             "--gap_penalty=none", "--clip=none", "--eager=false",
             "--carry_progress=false", "--apply=boundary"]

DELAYED_NESTEROV = ["--momentum=delayed_nesterov", "--momentum_period=4",
                    "--alpha=1.5", "--beta=0.7"]

# Variants: name -> (algo, which of the task's learning rates, extra flags).
# localsgd forces α=1, β=0, no penalty, no clip (trainer.cc); slowmo forces
# no penalty, no clip.
VARIANTS = {
    "ddp": ("ddp", "base", []),
    "localsgd": ("localsgd", "base", []),
    "slowmo": ("slowmo", "base", ["--alpha=1", "--beta=0.5"]),
    "diloco": ("diloco", "diloco", []),
    "co2": ("co2", "co2", CO2_OUTER),
    # Outer momentum under the one-round-stale average (docs/algorithm.md),
    # at the settings the τ = 48 sweep chose (docs/results/convergence.md).
    "co2-eager": ("co2", "co2", CO2_OUTER + ["--eager=true", "--alpha=0.9"]),
    # Eager updates at α = 0.5.
    "co2-eager-a0.5": ("co2", "co2", CO2_OUTER + ["--eager=true"]),
    "co2-dn": ("co2", "co2", CO2_OUTER + DELAYED_NESTEROV),
    "co2-eager-dn": ("co2", "co2", CO2_OUTER + DELAYED_NESTEROV + ["--eager=true"]),
    # Ablations: the paper's two stabilisers, each switched on.
    "co2-penalty": ("co2", "co2", CO2_OUTER + ["--gap_penalty=gap_aware"]),
    "co2-clip": ("co2", "co2", CO2_OUTER + ["--clip=adaptive", "--clip_value=3"]),
    "co2-int8": ("co2", "co2", CO2_OUTER + ["--codec=int8"]),
    # Why the defaults: the synchronous algorithms' lr, and the paper's
    # setting (α = 1 with the penalty and clipping).
    "co2-base-lr": ("co2", "base", CO2_OUTER),
}
# Stress: the paper's outer learning rate α = 1, at which plain co2's
# one-round-stale iteration is at the edge of stability (docs/outer-settings.md): does
# clipping, or the gap penalty, keep it from diverging? Fashion-MNIST, first
# seed and τ; the flags override the variant's.
STRESS = dict(name="stress-alpha1", flags=["--alpha=1"],
              variants=["co2", "co2-clip", "co2-penalty"])


def plan(quick, seeds, taus, outer_flags):
    """Returns the run specs of the study: dicts with id, task, variant, cmd args."""
    runs = []

    def add(task, variant, tau, seed, extra=(), group=None):
        algo, lr_kind, flags = VARIANTS[variant]
        t = TASKS[task]
        steps = t["quick_steps"] if quick else t["steps"]
        # Evaluate about 8 times per run whatever τ is.
        rounds = max(1, steps // tau)
        eval_every = max(1, rounds // 8)
        args = [f"--task={task}", f"--algo={algo}", f"--workers={WORKERS}",
                f"--tau={tau}", f"--steps={steps}", f"--seed={seed}",
                f"--batch_size={t['batch']}", f"--eval_every={eval_every}",
                "--progress=false"] + t["flags"]
        args += flags
        if algo != "ddp":
            args += outer_flags
        args += list(extra)
        args.append(f"--lr={t['lr'][lr_kind]:g}")
        g = group or f"{task}/tau{tau}/{variant}"
        runs.append(dict(id=f"{g}/seed{seed}", group=g, task=task,
                         variant=variant, tau=tau, seed=seed, steps=steps,
                         samples_per_step=WORKERS * t["batch"], args=args))

    for task, t in TASKS.items():
        if quick:
            for v in ["ddp", "co2"]:
                add(task, v, taus[0], seeds[0])
            continue
        # Seed-major order, so that a study cut short still has one seed of
        # every row.
        for s in seeds:
            for tau in taus:
                seeded = list(dict.fromkeys(t["seeded"] + [t["best_co2"][tau]]))
                for v in seeded:
                    if v != "ddp" or tau == taus[0]:
                        add(task, v, tau, s)
                if s == seeds[0]:
                    for v in t["single"]:
                        if v not in seeded:
                            add(task, v, tau, s)
            if s == seeds[0]:
                for v in t["ablations"]:
                    add(task, v, taus[0], s)
    if not quick:
        task = "fashion-mnist"
        for v in STRESS["variants"]:
            add(task, v, taus[0], seeds[0], extra=STRESS["flags"],
                group=f"{task}/{STRESS['name']}/{v}")
    return runs


def at_lr(spec, lr):
    """The run `spec` with only its inner lr changed; its own id unless lr is
    the plan's (then it is the study's run, cached or not)."""
    arg = f"--lr={lr:g}"
    if spec["args"][-1] == arg:  # plan() appends --lr last
        return dict(spec, lr=lr)
    g = f"{spec['group']}-lr{lr:g}"
    return dict(spec, group=g, id=f"{g}/seed{spec['seed']}", lr=lr,
                args=spec["args"][:-1] + [arg])


def write_lr_sweep(path, results, head):
    """Merges `results` into the lr-sweep file at `path`, one entry per
    (task, τ, variant, seed, lr): a later run of the same replaces it."""
    def key(r):
        return (r["task"], r["tau"], r["variant"], r["seed"], r["lr"])
    runs = {}
    if os.path.exists(path):
        with open(path) as f:
            runs = {key(r): r for r in json.load(f)["runs"]}
    for r in results:
        runs[key(r)] = r
    runs = [runs[k] for k in sorted(runs)]
    summary = [dict(task=r["task"], tau=r["tau"], variant=r["variant"], seed=r["seed"],
                    lr=r["lr"], metric=TASKS[r["task"]]["metric"],
                    value=r.get("final_metrics", {}).get(TASKS[r["task"]]["metric"]),
                    status=r["status"]) for r in runs]
    with open(path, "w") as f:
        json.dump(dict(head, study="convergence_lr_sweep", summary=summary, runs=runs),
                  f, indent=1)
    for row in summary:
        print(f"{row['task']:14} tau{row['tau']:<4} {row['variant']:10} seed{row['seed']} "
              f"lr {row['lr']:<8g} {row['metric']} {row['value']} ({row['status']})")


def run_one(spec, binary, work, timeout, rerun, cached_only=False):
    path = os.path.join(work, spec["id"].replace("/", "__") + ".json")
    log = path[:-5] + ".log"
    cmd = [binary] + spec["args"] + [f"--report={path}"]
    result = dict(spec, command=" ".join(shlex.quote(c) for c in
                                         ["co2-train"] + spec["args"]))
    if not rerun and os.path.exists(path + ".done"):
        with open(path + ".done") as f:
            cached = json.load(f)
        if same_run(spec["args"], cached, path):
            # The command recorded is the one that ran (it may spell the
            # same settings differently, e.g. relying on a flag default).
            for k in ("command", "wall_s", "rc", "diverged", "final_metrics",
                      "final_train_loss", "exposed_comm_fraction", "bytes_sent",
                      "params_identical", "curve", "status", "error_tail"):
                if k in cached:
                    result[k] = cached[k]
            return result
    if cached_only:
        return None
    start = time.time()
    try:
        with open(log, "w") as out:
            p = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT,
                               timeout=timeout)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
    result["wall_s"] = round(time.time() - start, 1)
    result["rc"] = rc
    with open(log, errors="replace") as f:
        text = f.read()
    result["diverged"] = "diverged" in text
    if rc == 0 and os.path.exists(path):
        with open(path) as f:
            report = json.load(f)
        task = TASKS[spec["task"]]
        result["final_metrics"] = report["final_metrics"]
        result["final_train_loss"] = report["final_train_loss"]
        result["exposed_comm_fraction"] = report["exposed_comm_fraction"]
        result["bytes_sent"] = report["bytes_sent"]
        result["params_identical"] = report["params_identical"]
        curve, seen = [], 0
        for c in report["curve"]:
            seen += c["steps"] * spec["samples_per_step"]
            point = dict(samples=seen, train_loss=round(c["loss"], 5))
            if task["curve"] in c:
                point["val"] = round(c[task["curve"]], 5)
            curve.append(point)
        result["curve"] = curve
        result["status"] = "ok"
    else:
        result["status"] = "diverged" if result["diverged"] else "failed"
        result["error_tail"] = text[-600:]
    with open(path + ".done", "w") as f:
        json.dump(result, f)
    print(f"[{result['status']:8}] {spec['id']:48} {result['wall_s']:7.1f}s "
          f"{json.dumps(result.get('final_metrics', {}))}", flush=True)
    return result


def same_run(args, cached, report_path):
    """True when a cached run had the effective settings `args` ask for."""
    ran = cached.get("args", [])
    if ran == args:
        return True
    settings = {}
    if os.path.exists(report_path):
        with open(report_path) as f:
            settings = json.load(f).get("settings", {})
    if not settings:
        return False
    last = {}
    for a in args:
        k, _, v = a[2:].partition("=")
        last[k] = v  # absl: the last occurrence wins
    for k, v in last.items():
        if k in settings:
            try:
                if float(settings[k]) != float(v):
                    return False
            except ValueError:
                if settings[k] != v:
                    return False
        elif f"--{k}={v}" not in ran:
            return False
    return True


def summarize(results):
    groups = {}
    for r in results:
        groups.setdefault(r["group"], []).append(r)
    rows = []
    for g, rs in groups.items():
        task = TASKS[rs[0]["task"]]
        vals = [r["final_metrics"][task["metric"]] for r in rs if r["status"] == "ok"]
        row = dict(group=g, task=rs[0]["task"], variant=rs[0]["variant"],
                   tau=rs[0]["tau"], metric=task["metric"], n=len(vals),
                   runs=len(rs), diverged=sum(r["status"] == "diverged" for r in rs),
                   failed=sum(r["status"] == "failed" for r in rs),
                   values=vals)
        if vals:
            row["mean"] = statistics.mean(vals)
            row["std"] = statistics.stdev(vals) if len(vals) > 1 else 0.0
        ok = [r for r in rs if r["status"] == "ok"]
        if ok:
            # Every worker's bytes up, per sample the job trained on.
            row["bytes_per_sample"] = statistics.mean(
                r["bytes_sent"] / (r["steps"] * r["samples_per_step"]) for r in ok)
            row["exposed_comm"] = statistics.mean(
                r["exposed_comm_fraction"] for r in ok)
        rows.append(row)
    # Gaps to ddp of the same task.
    ddp = {r["task"]: r for r in rows if r["variant"] == "ddp" and "mean" in r}
    for r in rows:
        d = ddp.get(r["task"])
        if d is None or "mean" not in r or r is d:
            continue
        if TASKS[r["task"]]["higher_better"]:
            r["vs_ddp"] = f"{100 * (r['mean'] - d['mean']):+.2f} pt"
        else:
            r["vs_ddp"] = f"{100 * (r['mean'] / d['mean'] - 1):+.2f} %"
    return rows


def fmt(row):
    if "mean" not in row:
        return "—"
    scale = 100 if row["metric"] == "test_accuracy" else 1
    digits = 2 if scale == 100 else 4
    s = f"{scale * row['mean']:.{digits}f}"
    if row["n"] > 1:
        s += f" ± {scale * row['std']:.{digits}f}"
    return s


def table(rows):
    lines = ["| task | τ / case | variant | metric | mean ± std | runs ok / diverged / total "
             "| vs ddp | bytes up / sample | exposed comm. |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        case = r["group"].split("/")[1]
        metric = "test acc. %" if r["metric"] == "test_accuracy" else "val loss"
        per_sample = (f"{r['bytes_per_sample']:,.0f}" if "bytes_per_sample" in r
                      else "")
        exposed = (f"{100 * r['exposed_comm']:.1f} %" if "exposed_comm" in r
                   else "")
        lines.append(f"| {r['task']} | {case} | {r['variant']} | {metric} | {fmt(r)} | "
                     f"{r['n']} / {r['diverged']} / {r['runs']} | {r.get('vs_ddp', '')} "
                     f"| {per_sample} | {exposed} |")
    return "\n".join(lines)


def plots(results, out, prefix):
    if shutil.which("gnuplot") is None:
        print("gnuplot not found: no plots", file=sys.stderr)
        return []
    made = []
    cases = {}
    for r in results:
        if r["status"] != "ok":
            continue
        task, case = r["group"].split("/")[:2]
        cases.setdefault((task, case), {}).setdefault(r["variant"], []).append(r)
    data_dir = os.path.join(out, ".plotdata")
    os.makedirs(data_dir, exist_ok=True)
    for (task, case), variants in sorted(cases.items()):
        series = []
        for v, rs in variants.items():
            # Mean over seeds, point by point (same schedule for every seed).
            points = {}
            for r in rs:
                for p in r["curve"]:
                    if "val" in p:
                        points.setdefault(p["samples"], []).append(p["val"])
            if not points:
                continue
            f = os.path.join(data_dir, f"{task}_{case}_{v}.dat")
            with open(f, "w") as fh:
                for s in sorted(points):
                    fh.write(f"{s} {statistics.mean(points[s])}\n")
            series.append((v, f))
        if not series:
            continue
        png = os.path.join(out, f"{prefix}_{task}_{case}.png")
        ylabel = ("validation accuracy (1000 test images)" if task == "fashion-mnist"
                  else "validation loss (nats/char)")
        script = [
            "set terminal png size 800,500",
            f"set output '{png}'",
            f"set title '{task}, {case}, {WORKERS} workers (mean over seeds)'",
            "set xlabel 'samples seen'", f"set ylabel '{ylabel}'",
            "set key outside right", "set grid",
            "plot " + ", ".join(f"'{f}' using 1:2 with linespoints title '{v}'"
                                for v, f in series),
        ]
        subprocess.run(["gnuplot"], input="\n".join(script), text=True, check=True)
        made.append(os.path.relpath(png, ROOT))
    shutil.rmtree(data_dir, ignore_errors=True)
    return made


def machine(load_at_start):
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    return dict(cpu=cpu, cores=os.cpu_count(), kernel=platform.release(),
                python=platform.python_version(),
                load_average_at_start=load_at_start, load_average_at_end=load)


def git_head():
    try:
        return subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def update_docs(path, text):
    begin, end = "<!-- convergence:begin -->", "<!-- convergence:end -->"
    with open(path) as f:
        doc = f.read()
    if begin not in doc or end not in doc:
        print(f"{path}: no convergence markers; table not inserted", file=sys.stderr)
        return
    head, rest = doc.split(begin, 1)
    _, tail = rest.split(end, 1)
    with open(path, "w") as f:
        f.write(head + begin + "\n" + text + "\n" + end + tail)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke test: 1 seed, few steps")
    ap.add_argument("--bin", default=os.path.join(ROOT, "build/bin/co2-train"))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/results"))
    ap.add_argument("--work", default="",
                    help="per-run reports and logs, the resume cache "
                         "(default /tmp/co2-convergence[-quick])")
    ap.add_argument("--docs", default=os.path.join(ROOT, "docs/results/convergence.md"),
                    help="file whose convergence markers get the table ('' = none)")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--taus", default="12,48,128")
    ap.add_argument("--only", default="", help="regex on run ids")
    ap.add_argument("--jobs", type=int, default=1, help="runs at a time")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per run")
    ap.add_argument("--rerun", action="store_true", help="ignore cached runs")
    ap.add_argument("--outer", default="",
                    help="extra outer flags for every non-ddp run, e.g. '--beta=0.2'")
    ap.add_argument("--lrs", default="",
                    help="an inner-lr sweep: the selected runs at each of these lrs "
                         "(comma-separated), merged into <out>/convergence_lr_sweep.json; "
                         "the study's outputs are left alone")
    ap.add_argument("--list", action="store_true", help="print the plan and exit")
    ap.add_argument("--cached_only", action="store_true",
                    help="run nothing: summarise the runs already in --work")
    a = ap.parse_args()

    if not a.work:
        a.work = "/tmp/co2-convergence" + ("-quick" if a.quick else "")
    seeds = [int(s) for s in a.seeds.split(",")]
    taus = [int(t) for t in a.taus.split(",")]
    runs = plan(a.quick, seeds, taus, shlex.split(a.outer))
    if a.only:
        runs = [r for r in runs if re.search(a.only, r["id"])]
    if a.lrs:
        runs = [at_lr(r, float(lr)) for r in runs for lr in a.lrs.split(",")]
    if a.list:
        for r in runs:
            print(r["id"], " ".join(r["args"]))
        return 0
    if not a.cached_only and not os.access(a.bin, os.X_OK):
        print(f"co2-train not found at {a.bin} (--bin)", file=sys.stderr)
        return 2
    os.makedirs(a.work, exist_ok=True)
    os.makedirs(a.out, exist_ok=True)
    start = time.time()
    load_at_start = os.getloadavg()
    with ThreadPoolExecutor(max_workers=a.jobs) as pool:
        results = list(pool.map(lambda s: run_one(s, a.bin, a.work, a.timeout, a.rerun,
                                                  a.cached_only), runs))
    not_run = [s["id"] for s, r in zip(runs, results) if r is None]
    results = [r for r in results if r is not None]
    if a.lrs:
        write_lr_sweep(os.path.join(a.out, "convergence_lr_sweep.json"), results,
                       dict(note="each run is the study's run (run.py's plan) with only "
                                 "--lr changed: run.py --only ... --lrs ...",
                            binary=a.bin, git_head=git_head(), machine=machine(load_at_start)))
        return 1 if any(r["status"] == "failed" for r in results) else 0
    rows = summarize(results)
    name = "convergence_quick" if a.quick else "convergence"
    pngs = plots(results, a.out, name)
    doc = dict(
        study=name, partial=bool(a.only or not_run) or a.quick, not_run=not_run,
        command=" ".join(shlex.quote(x) for x in sys.argv),
        binary=a.bin, git_head=git_head(),
        machine=machine(load_at_start), wall_time_s=round(time.time() - start, 1),
        workers=WORKERS, seeds=seeds, taus=taus, tasks=TASKS,
        summary=rows, plots=pngs, runs=results)
    with open(os.path.join(a.out, name + ".json"), "w") as f:
        json.dump(doc, f, indent=1)
    text = table(rows)
    print(text)
    if a.docs and not a.quick:
        update_docs(a.docs, text)
    bad = [r["id"] for r in results if r["status"] == "failed"]
    if bad:
        print("failed runs: " + ", ".join(bad), file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
