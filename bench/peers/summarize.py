"""The peers benchmark's table, JSON and plot (bench/peers/run.py).

Per row, measured the same way for every system:
  final_val_loss     worker 0's validation loss after the last step (nats/byte);
  time_to_target_s   worker 0's clock when its validation loss first reaches
                     the target (DDP's final loss on the unshaped link, same
                     size and seed, + 2 %; --quick: DDP's at 100 Mbit/s),
                     interpolated between evaluations; absent if never;
  wall_s             the slowest worker's clock (evaluations excluded);
  vs_local           samples/s against the no-communication run of the same
                     size and seed (the same loop with the inner AdamW alone);
  exposed_share      1 - vs_local: the share of the wall time not spent on the
                     no-communication loop's work, i.e. blocked on the network
                     or spent on the exchange's own CPU work;
  wire_bytes_per_worker  tx + rx of a worker namespace's eth0 over the whole
                     run (setup included), the mean over workers.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import tempfile

import stats

TARGET_MARGIN = 1.02


def time_to(curve: list, target: float):
    prev = {"wall_s": 0.0, "val_loss": None}
    for p in curve:
        if p["val_loss"] <= target:
            if prev["val_loss"] is None:
                return p["wall_s"]
            f = (prev["val_loss"] - target) / (prev["val_loss"] - p["val_loss"])
            return prev["wall_s"] + f * (p["wall_s"] - prev["wall_s"])
        prev = p
    return None


def row_of(rec: dict, records: dict) -> dict:
    r = rec["run"]
    row = {k: r[k] for k in ("name", "system", "size", "link", "tau", "seed", "steps", "lr")}
    row["repeat"] = r.get("repeat", 1)
    row["load_1min"] = rec.get("load_1min")
    row["cpu"] = rec.get("cpu")
    if "error" in rec:
        row["error"] = rec["error"]
        return row
    ranks = rec["ranks"]
    r0 = ranks[0]
    wall = max(x["train_s"] for x in ranks)
    samples = r0["curve"][-1]["samples"]
    workers = [ns for ns in rec["wire"] if not ns.endswith("-agg")]
    row.update({
        "params": r0["params"],
        "final_val_loss": r0["final_val_loss"],
        "final_val_loss_worker_mean": statistics.mean(x["final_val_loss"] for x in ranks),
        "workers_agree": len({x["params_digest"] for x in ranks}) == 1,
        "wall_s": wall,
        "samples": samples,
        "samples_per_s": samples / wall,
        "optimizer_step_share": statistics.mean(x["optimizer_step_s"] / x["train_s"] for x in ranks),
        "wire_bytes_per_worker": statistics.mean(
            rec["wire"][ns]["tx_bytes"] + rec["wire"][ns]["rx_bytes"] for ns in workers),
        "wire_bytes_in_clock_per_worker": statistics.mean(
            x["net_tx_bytes"] + x["net_rx_bytes"] for x in ranks),
        "curve": [{k: p[k] for k in ("samples", "wall_s", "val_loss")} for p in r0["curve"]],
        "notes": r0.get("notes", {}),
    })
    local = reference(records, r, rec.get("cpu"), row["repeat"])
    if local and r["system"] != "local":
        local_wall = max(x["train_s"] for x in local["ranks"])
        row["vs_local"] = local_wall / wall
        row["exposed_share"] = 1 - local_wall / wall
    # DDP's final loss on the unshaped link; --quick runs DDP at 100 Mbit/s only.
    for link in ("none", "100mbit"):
        ddp = records.get(f"{r['size']}-{link}-seed{r['seed']}-ddp")
        if ddp and "error" not in ddp:
            target = ddp["ranks"][0]["final_val_loss"] * TARGET_MARGIN
            row.update(target_loss=target, target_from=f"ddp, link {link}",
                       time_to_target_s=time_to(r0["curve"], target))
            break
    return row


def reference(records: dict, r: dict, cpu, repeat: int):
    """The no-communication run a row's throughput is measured against: of
    the same size and seed, timed on the same CPU (a run records its CPU's
    model; runs seeded from results that predate that have none) and, among
    those, of the same repeat, else the first; None if there is none."""
    base = f"{r['size']}-local-seed{r['seed']}"
    runs = {1 if name == base else int(name[len(base) + 2:]): rec
            for name, rec in records.items()
            if (name == base or re.fullmatch(re.escape(base) + r"-r[0-9]+", name))
            and "error" not in rec and rec.get("cpu") == cpu}
    return runs.get(repeat) or (runs[min(runs)] if runs else None)


def repeats_summary(table: list) -> list:
    """Per (size, link, tau, seed, system, lr, CPU): the median, min and max
    over the repeats of time to target, wall time and exposed share. Times
    are only comparable on one CPU, so repeats on different CPUs are
    separate entries."""
    groups = {}
    for row in table:
        if "error" not in row and row["system"] != "local":
            key = (row["size"], row["link"], row["tau"], row["seed"], row["system"], row["lr"],
                   row.get("cpu"))
            groups.setdefault(key, []).append(row)
    out = []
    for (size, link, tau, seed, system, lr, cpu), rows in groups.items():
        entry = {"size": size, "link": link, "tau": tau, "seed": seed, "system": system,
                 "lr": lr, "cpu": cpu, "repeats": len(rows),
                 "wire_bytes_per_worker": statistics.median(r["wire_bytes_per_worker"] for r in rows)}
        for k in ("final_val_loss", "time_to_target_s", "wall_s", "exposed_share"):
            vals = [r.get(k) for r in rows]
            if any(v is None for v in vals):
                entry[k] = None
                continue
            entry[k] = {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}
        out.append(entry)
    return out


def build(records: dict, rows: list, not_run: list, *, command: str, versions: dict,
          installed: dict, machine: dict, quick: bool) -> dict:
    table = [row_of(records[r["name"]], records) for r in rows if r["name"] in records]
    return {
        "what": "co2 against torch DDP, torchft (DiLoCo, streaming DiLoCo, LocalSGD) and "
                "hivemind: 4 workers train a byte-level transformer LM on Debian's fortunes, "
                "each worker behind its own link (bench/peers/run.py, docs/results/peers.md)",
        "command": command,
        "quick": quick,
        "machine": machine,
        "versions": versions,
        "peers_install": installed,
        "links": {"none": "veth, no shaping", "1gbit": "tc tbf 1 Gbit/s each direction",
                  "100mbit": "tc tbf 100 Mbit/s each direction"},
        "metrics": __doc__.split("Per row, ")[1].strip(),
        "rows": table,
        "repeats_summary": repeats_summary(table),
        "not_run": not_run,
        "runs": {name: {"commit": rec.get("commit"), "cpu": rec.get("cpu"),
                        "elapsed_s": rec.get("elapsed_s"),
                        **({"error": rec["error"]} if "error" in rec else {}),
                        "worker_commands": rec.get("commands", []),
                        "wire": rec.get("wire"),
                        "ranks": [{k: v for k, v in x.items() if k != "curve"}
                                  for x in rec.get("ranks", [])]}
                 for name, rec in records.items()},
    }


def fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def print_table(result: dict) -> None:
    print(f"{'row':44} {'final':>7} {'t_target':>8} {'wall':>7} {'vs_local':>8} "
          f"{'exposed':>7} {'MB/worker':>9}")
    for row in result["rows"]:
        if "error" in row:
            print(f"{row['name']:44} ERROR {row['error'][:200]!r}")
            continue
        print(f"{row['name']:44} {row['final_val_loss']:7.4f} "
              f"{fmt(row.get('time_to_target_s'), '8.1f')} {row['wall_s']:7.1f} "
              f"{fmt(row.get('vs_local'), '8.2f')} {fmt(row.get('exposed_share'), '7.2f')} "
              f"{row['wire_bytes_per_worker'] / 1e6:9.1f}")
    for name in result["not_run"]:
        print(f"{name:44} not run")


def plot(result: dict, path: str, size: str = "small", link: str = "100mbit",
         tau: int = 16, seed: int = 1) -> list:
    """Validation loss against wall time, one line per system, at LINK; of a
    system's repeats, the one with the median wall time. Times compare only
    on one CPU, so each CPU gets its own plot: the one with the most systems
    at PATH, the others beside it named after their CPU. Returns the paths."""
    by_cpu = {}
    for r in result["rows"]:
        if ("error" not in r and r["system"] != "local" and r["size"] == size
                and r["link"] == link and r["seed"] == seed
                and (r["tau"] == tau or r["system"] == "ddp")):
            by_cpu.setdefault(r.get("cpu"), {}).setdefault(r["system"], []).append(r)
    written = []
    stem, ext = os.path.splitext(path)
    for i, (cpu, runs) in enumerate(sorted(by_cpu.items(), key=lambda kv: -len(kv[1]))):
        slug = re.sub(r"[^a-z0-9]+", "-", cpu_label(cpu).lower())
        out = path if i == 0 else f"{stem}-{slug}{ext}"
        plot_one(runs, out, f"{size} model, 4 workers, {link} per worker, tau {tau}, "
                 f"CPU: {cpu_label(cpu)}")
        written.append(out)
    return written


def plot_one(runs: dict, path: str, what: str) -> None:
    rows = [sorted(rs, key=lambda r: r["wall_s"])[(len(rs) - 1) // 2] for rs in runs.values()]
    with tempfile.TemporaryDirectory() as tmp:
        plots = []
        for i, r in enumerate(rows):
            data = os.path.join(tmp, f"{i}.dat")
            with open(data, "w") as f:
                for p in r["curve"]:
                    f.write(f"{p['wall_s']} {p['val_loss']}\n")
            title = r["system"] + (f" (repeat {r['repeat']})" if len(runs[r["system"]]) > 1 else "")
            plots.append(f"'{data}' using 1:2 with linespoints title '{title}'")
        target = rows[0].get("target_loss")
        if target:
            plots.append(f"{target} with lines dashtype 2 lc rgb 'gray' title 'target'")
        script = (f"set terminal pngcairo size 800,500 font ',10'\nset output '{path}'\n"
                  f"set title 'validation loss, {rows[0]['params'] / 1e6:.1f}M parameters, "
                  f"{what}'\n"
                  "set xlabel 'wall time (s, log scale)'\nset ylabel 'validation loss (nats/byte)'\n"
                  "set key top right\nset grid\nset yrange [2.55:3.1]\n"
                  "set logscale x\nplot " + ", ".join(plots) + "\n")
        subprocess.run(["gnuplot"], input=script, text=True, check=True, timeout=60)


def markdown(result: dict) -> str:
    """docs/results/peers.md's table: per row, the median over its repeats and,
    where there are several, [min–max]; the runs of each CPU together (those
    that recorded none first), in the grid's order."""
    def spread(v, digits):
        if v is None:  # e.g. no no-communication run on the row's CPU
            return "-"
        text = f"{v['median']:.{digits}f}"
        if v["min"] == v["max"]:
            return text
        return f"{text} [{v['min']:.{digits}f}–{v['max']:.{digits}f}]"

    def to_target(v):
        return "not reached" if v is None else spread(v, 1)

    failed = [r for r in result["rows"] if "error" in r and r["system"] != "local"]
    entries = result["repeats_summary"] + failed
    cpus = list(dict.fromkeys(e.get("cpu") for e in entries))
    cpus.sort(key=lambda c: c is not None)
    lines = ["| CPU | model | link | τ | seed | system | inner lr | runs | time to target (s) | "
             "final val loss | wall (s) | exposed | MB/worker |", "|" + "---|" * 13]
    for e in sorted(entries, key=lambda e: cpus.index(e.get("cpu"))):
        first = (f"| {cpu_label(e.get('cpu'))} | {e['size']} | {e['link']} | {e['tau']} | "
                 f"{e['seed']} | {e['system']} | {e['lr']:g} | ")
        if "error" in e:
            lines.append(first + f"failed | {failure(e['error'])} | | | | |")
            continue
        lines.append(first + f"{e['repeats']} | {to_target(e['time_to_target_s'])} | "
                     f"{spread(e['final_val_loss'], 4)} | {spread(e['wall_s'], 1)} | "
                     f"{spread(e['exposed_share'], 2)} | {e['wire_bytes_per_worker'] / 1e6:.0f} |")
    return "\n".join(lines)


def failure(error: str) -> str:
    """What stopped a failed run ("worker 0 ran past its 900 s limit"),
    without the log tail its error goes on with."""
    return error.partition(": ")[0]


def cpu_label(cpu) -> str:
    """A CPU's model without its trademarks, or "not recorded"."""
    if cpu is None:
        return "not recorded"
    return re.sub(r"\((R|TM)\)", "", cpu).replace(" Processor", "").strip()


def sweep_markdown(result: dict) -> str:
    """docs/results/peers.md's sweep table: per model size, each system's final
    loss at each lr it ran (the best in bold)."""
    sweeps = result.get("lr_sweep", {})
    lrs = sorted({run["lr"] for at in sweeps.values() for s in at["systems"].values()
                  for run in s["runs"]})
    lines = ["| model | system | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " | best |",
             "|" + "---|" * (len(lrs) + 3)]
    for size, at in sweeps.items():
        for system, s in at["systems"].items():
            cells = {run["lr"]: run for run in s["runs"]}

            def cell(lr):
                run = cells.get(lr)
                if run is None:
                    return ""
                if run.get("final_val_loss") is None:
                    return "failed" if "error" in run else "not run"
                text = f"{run['final_val_loss']:.4f}"
                return f"**{text}**" if lr == s["best_lr"] else text

            best = "-" if s["best_lr"] is None else f"{s['best_lr']:g}"
            lines.append(f"| {size} | {system} | " + " | ".join(cell(lr) for lr in lrs)
                         + f" | {best} |")
    return "\n".join(lines)


if __name__ == "__main__":
    import sys
    with open(sys.argv[1]) as f:
        result = json.load(f)
    print(sweep_markdown(result) + "\n\n" + markdown(result))


# -- the referee's table (run.py --referee; stats.py holds the arithmetic) --

def referee_metrics(rec: dict, ref: dict, equal_samples: int) -> dict:
    """One run's row of the referee table: its targets against its seed's
    DDP on the unshaped link (`ref`), its bytes per worker and on every
    link, its link check."""
    r = rec["run"]
    row = {k: r[k] for k in ("name", "phase", "system", "setting", "size", "link", "rtt_ms",
                             "loss", "topology", "tau", "seed", "steps", "full_steps", "lr")}
    row.update(commit=rec.get("commit"), cpu=rec.get("cpu"), link_check=rec.get("link_check"))
    if "error" in rec:
        row["error"] = rec["error"]
        return row
    r0 = rec["ranks"][0]
    curve = [{k: p[k] for k in ("samples", "wall_s", "val_loss")} for p in r0["curve"]]
    links = {ns: w["tx_bytes"] + w["rx_bytes"] for ns, w in rec["wire"].items()}
    workers = [v for ns, v in links.items() if not ns.endswith("-agg")]
    row.update(final_val_loss=r0["final_val_loss"], wall_s=max(x["train_s"] for x in rec["ranks"]),
               samples=curve[-1]["samples"], curve=curve, bytes_per_link=links,
               wire_bytes_per_worker=statistics.mean(workers),
               wire_bytes_all_links=sum(links.values()))
    if ref is not None and "error" not in ref:
        ddp_final = ref["ranks"][0]["final_val_loss"]
        ddp_s = max(x["train_s"] for x in ref["ranks"])
        row.update(ddp_final_loss=ddp_final, ddp_unshaped_s=ddp_s,
                   metrics=stats.targets(curve, ddp_final, ddp_s, equal_samples,
                                         complete=r["steps"] == r["full_steps"]))
    return row


def cell_key(r: dict) -> str:
    import referee
    return referee.cell_name(r["link"], r["rtt_ms"], r["loss"])


def mixed_commits(records: dict, phases=("headline", "loss", "smoke")) -> dict:
    """commit -> the names of the measured runs of `phases` at it, when
    there is more than one commit (else empty): such rows are not compared."""
    by = {}
    for name, rec in records.items():
        if "error" not in rec and rec["run"].get("phase") in phases:
            by.setdefault(rec.get("commit"), []).append(name)
    return by if len(by) > 1 else {}


def referee_cells(rows: list) -> list:
    """Per (phase, cell, topology): each system's rows by seed and, for
    co2 against each peer, the paired comparison of every metric. The
    peers' rows of "same" stand for "service" where they ran in "same"
    only (their data path does not cross the service host)."""
    out = []
    measured = [r for r in rows if "metrics" in r and r["phase"] != "select"
                and not (r["system"] == "ddp" and r["link"] == "none")]
    keys = sorted({(r["phase"], cell_key(r)) for r in measured})
    for phase, cell in keys:
        here = [r for r in measured if (r["phase"], cell_key(r)) == (phase, cell)]
        for topology in ("service", "same"):
            by_system = {}
            for system in dict.fromkeys(r["system"] for r in here):
                tops = [topology] if system == "co2" else [topology, "same"]
                for t in tops:
                    got = {r["seed"]: r for r in here if r["system"] == system
                           and r["topology"] == t}
                    if got:
                        by_system[system] = {"topology": t, "seeds": got}
                        break
            if "co2" not in by_system:
                continue
            entry = {"phase": phase, "cell": cell, "topology": topology, "systems": {},
                     "co2_against": {}}
            for system, x in by_system.items():
                seeds = x["seeds"]
                med = {}
                for m in stats.METRICS:
                    vals = [r["metrics"][m] for r in seeds.values()]
                    med[m] = statistics.median(vals) if all(v is not None for v in vals) else None
                entry["systems"][system] = {
                    "topology": x["topology"], "seeds": sorted(seeds), "median": med,
                    "wire_bytes_per_worker": statistics.median(
                        r["wire_bytes_per_worker"] for r in seeds.values()),
                    "wire_bytes_all_links": statistics.median(
                        r["wire_bytes_all_links"] for r in seeds.values())}
            co2 = by_system["co2"]["seeds"]
            for system, x in by_system.items():
                if system == "co2":
                    continue
                entry["co2_against"][system] = {
                    m: stats.paired({s: r["metrics"][m] for s, r in co2.items()},
                                    {s: r["metrics"][m] for s, r in x["seeds"].items()})
                    for m in stats.METRICS}
            out.append(entry)
    return out


def referee_build(records: dict, rows: list, *, versions: dict, installed: dict,
                  machine: dict, orders: dict) -> dict:
    """The referee JSON: every run, each row's metrics, and (when every
    compared row is at one commit) the per-cell table."""
    refs = {(rec["run"]["phase"], rec["run"]["seed"]): rec for rec in records.values()
            if rec["run"].get("system") == "ddp" and rec["run"].get("link") == "none"}
    samples = {}
    for rec in records.values():
        if "error" not in rec:
            k = (rec["run"]["phase"], cell_key(rec["run"]))
            s = rec["ranks"][0]["curve"][-1]["samples"]
            samples[k] = min(samples.get(k, s), s)
    table = [referee_metrics(records[r["name"]], refs.get((r["phase"], r["seed"])),
                             samples.get((r["phase"], cell_key(r)), 0))
             for r in rows if r["name"] in records]
    mixed = mixed_commits({r["name"]: records[r["name"]] for r in rows if r["name"] in records})
    return {"what": "bench/peers under a referee's rules (run.py --referee, issue 63)",
            "machine": machine, "versions": versions, "peers_install": installed,
            "metrics": stats.__doc__, "system_order_per_seed": orders,
            "mixed_commits": mixed, "rows": table,
            "cells": [] if mixed else referee_cells(table),
            "not_run": [r["name"] for r in rows if r["name"] not in records],
            "runs": {name: rec for name, rec in records.items()}}


def print_referee(result: dict) -> None:
    """Per cell and topology: each system's medians and bytes, then co2
    against each peer per metric: the median paired difference, its 95 %
    interval, the method and the word."""
    for row in result["rows"]:
        if row.get("error"):
            print(f"{row['name']:60} ERROR {failure(row['error'])}")
            continue
        chk = row.get("link_check") or {}
        m = chk.get("measured") or {}
        links = " ".join(f"{ns.rsplit('-', 1)[1]}={v / 1e6:.1f}"
                         for ns, v in row["bytes_per_link"].items())
        print(f"{row['name']:60} final {row['final_val_loss']:.4f} wall {row['wall_s']:6.1f} s  "
              f"link check: ping {m.get('ping_rtt_ms', '-')} ms iperf3 "
              f"{m.get('iperf3_mbit', '-')} Mbit/s  MB per link: {links}  "
              f"total {row['wire_bytes_all_links'] / 1e6:.1f}")
    if result["mixed_commits"]:
        print("REFUSED: the compared rows ran at more than one commit: " + "; ".join(
            f"{c}: {', '.join(sorted(n))}" for c, n in result["mixed_commits"].items()))
        return
    for cell in result["cells"]:
        print(f"\n== {cell['phase']} {cell['cell']}, topology {cell['topology']}")
        print(f"{'system':18} {'top.':7} " + " ".join(f"{m[:22]:>22}" for m in stats.METRICS)
              + f" {'MB/worker':>9} {'MB all links':>12}")
        for system, x in cell["systems"].items():
            print(f"{system:18} {x['topology']:7} " + " ".join(
                f"{fmt(x['median'][m], '.4f'):>22}" for m in stats.METRICS)
                + f" {x['wire_bytes_per_worker'] / 1e6:9.1f} {x['wire_bytes_all_links'] / 1e6:12.1f}")
        for peer, by_metric in cell["co2_against"].items():
            for m, c in by_metric.items():
                iv = c["interval"]
                iv = "-" if iv is None else f"[{iv[0]:+.4f}, {iv[1]:+.4f}]"
                print(f"  co2 - {peer:18} {m:24} median {fmt(c['median_difference'], '+.4f'):>9}"
                      f" 95% {iv:22} {c['word']:9} ({c['method']})")
