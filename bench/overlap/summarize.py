#!/usr/bin/env python3
"""Turns the rank reports of bench/run_overlap.sh into overlap.json and a plot.

Throughput of a run: the sum over workers of steps x batch / train_s (each
worker's own training window, from its co2-train rank report), leaving out
co2's final drain (one wait for the last update, once per run: a long run
amortises it; ratio_with_drain keeps it). Every ratio is to the mean of the
two no-communication runs (first and last) of the same link setting.

The model (docs/performance.md §1): a round moves P·b bytes each way over a worker's
link, c = P·b/bandwidth. The shards stream the update: a chunk of U_r leaves
as soon as every worker's chunk of Δ_r has arrived, so the download runs
under the upload, and a round's update is whole once the upload is done
and the last chunk of each shard has come down: u = c + S·chunk/bandwidth
after the round started (co2 hides the round when u < τ·t_step). co2's
predicted ratio is τ·t_step / max(τ·t_step, u); slowmo waits for it every
round: τ·t / (τ·t + u). With --whole_rounds (shards run with
--stream_updates=false) the download starts only when the uploads are
done: u = 2c. ddp's ring all-reduce moves 2(N-1)/N·P·b each way
every step: t / (t + 2(N-1)/N·c).
"""
import argparse
import glob
import json
import math
import os
import platform
import subprocess

TARGET = 0.97
CHUNK_BYTES = 1 << 18  # common::kChunkElements fp32 elements: one message


def machine():
    # The fields of bench/bench_util.cc MachineJson(), from Python.
    model = "unknown"
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    mem_kib = int(open("/proc/meminfo").readline().split()[1])
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kib / 2**20, 1),
        "kernel": platform.system() + " " + platform.release(),
        "load_average_at_end": open("/proc/loadavg").read()[:14],
    }


def load_run(directory, batch):
    ranks = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(directory, "rank-*-0.json")))]
    if not ranks:
        return None
    # co2's Finish waits for the last round's update (the drain): a fixed
    # cost per run, not per round, which the report keeps out of "rounds".
    for r in ranks:
        r["drain_s"] = max(0.0, r["exposed_comm_s"] - sum(x["exposed_comm_s"] for x in r["rounds"]))
    samples_per_s = sum(r["steps"] * batch / (r["train_s"] - r["drain_s"]) for r in ranks)
    mean_train = sum(r["train_s"] - r["drain_s"] for r in ranks) / len(ranks)
    mean_exposed = sum(r["exposed_comm_s"] - r["drain_s"] for r in ranks) / len(ranks)
    return {
        "workers": len(ranks),
        "steps": int(ranks[0]["steps"]),
        "samples_per_s": samples_per_s,
        "samples_per_s_with_drain": sum(r["steps"] * batch / r["train_s"] for r in ranks),
        "drain_s": sum(r["drain_s"] for r in ranks) / len(ranks),
        "t_step_s": sum(r["train_s"] / r["steps"] for r in ranks) / len(ranks),
        "exposed_fraction": mean_exposed / mean_train if mean_train > 0 else 0.0,
        "bytes_sent_per_worker": sum(r["bytes_sent"] for r in ranks) / len(ranks),
        "parameters": int(ranks[0]["memory_bytes"]["params"]) // 4,
    }


def predicted_ratio(algo, tau, t_step, comm_s, workers, round_s):
    """round_s: how long a round's update takes to arrive (u in the docstring)."""
    if algo == "co2":
        return tau * t_step / max(tau * t_step, round_s)
    if algo == "slowmo":
        return tau * t_step / (tau * t_step + round_s)
    if algo == "ddp":
        return t_step / (t_step + 2 * (workers - 1) / workers * comm_s)
    return 1.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scratch", required=True)
    ap.add_argument("--rates", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--plot", required=True)
    ap.add_argument("--command", required=True)
    ap.add_argument("--shards", type=int, required=True)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--whole_rounds", action="store_true",
                    help="the shards ran with --stream_updates=false")
    args = ap.parse_args()

    results = []
    parameters = 0
    for rate in args.rates.split():
        iperf = float(open(os.path.join(args.scratch, f"iperf-{rate}")).read())
        runs_dir = os.path.join(args.scratch, "runs")
        refs = [load_run(os.path.join(runs_dir, f"{rate}-local-{when}"), args.batch)
                for when in ("first", "last")]
        reference = sum(r["samples_per_s"] for r in refs) / len(refs)
        parameters = refs[0]["parameters"]
        t_step = sum(r["t_step_s"] for r in refs) / len(refs)
        comm_s = parameters * 4 * 8 / (iperf * 1e6)  # fp32, one direction
        tail_s = args.shards * CHUNK_BYTES * 8 / (iperf * 1e6)
        round_s = 2 * comm_s if args.whole_rounds else comm_s + tail_s
        runs = []
        for path in sorted(glob.glob(os.path.join(runs_dir, f"{rate}-*"))):
            name = os.path.basename(path)[len(rate) + 1:]
            algo, _, tau = name.partition("-tau")
            run = load_run(path, args.batch)
            if run is None:
                continue
            tau = int(tau) if tau else (1 if algo == "ddp" else None)
            runs.append({
                "algo": "none" if algo.startswith("local") else algo,
                "tau": tau,
                "steps": run["steps"],
                "samples_per_s": round(run["samples_per_s"], 2),
                "ratio": round(run["samples_per_s"] / reference, 4),
                "ratio_with_drain": round(run["samples_per_s_with_drain"] / reference, 4),
                "one_minus_exposed": round(1 - run["exposed_fraction"], 4),
                "drain_s": round(run["drain_s"], 3),
                "exposed_fraction": round(run["exposed_fraction"], 4),
                "predicted_ratio": round(predicted_ratio(algo, tau or 1, t_step, comm_s, run["workers"],
                                                         round_s), 4),
                "tau_t_step_s": round((tau or 1) * t_step, 4),
                "bytes_sent_per_worker": run["bytes_sent_per_worker"],
            })
        order = {"none": 0, "ddp": 1, "slowmo": 2, "co2": 3}
        runs.sort(key=lambda r: (order[r["algo"]], r["tau"] or 0))
        reached = [r["tau"] for r in runs if r["algo"] == "co2" and r["ratio"] >= TARGET]
        with open(os.path.join(args.scratch, f"link-{rate}.json")) as f:
            link = json.load(f)
        results.append({
            "rate": rate,
            "link": link,
            "iperf3_mbit_s": round(iperf, 1),
            "reference_samples_per_s": round(reference, 2),
            "t_step_s": round(t_step, 4),
            "comm_s_per_round": round(comm_s, 4),
            "min_tau_section8": math.ceil(comm_s / t_step),
            "update_s_per_round": round(round_s, 4),
            "predicted_min_tau": math.ceil(round_s / t_step),
            "measured_min_tau": min(reached) if reached else None,
            "runs": runs,
        })

    report = {
        "what": "samples/s of 4 workers as a ratio to no communication, each worker in "
                "its own network namespace behind a tc tbf link (both directions), the "
                "aggregator shards in another (unshaped link); exposed_fraction is the "
                "client's exposed communication / training time; predicted_ratio: "
                "P·b/bandwidth (iperf3) against τ·t_step (t_step from the "
                "no-communication run): a round's update arrives c after it starts "
                "(streamed by the shards) or 2c (whole rounds: up, then down; "
                "bench/overlap/summarize.py)",
        "command": args.command,
        "machine": machine(),
        "setup": {
            "model": "fashion-mnist --model=wide (MLP 784-2048-2048-10)",
            "parameters": parameters,
            "codec": "fp32 both ways",
            "workers": 4, "local_ranks": 1, "threads_per_worker": 1,
            "batch_size": args.batch, "shards": args.shards,
            "optimizer": "adamw; outer alpha 1, beta 0.5",
            "shards_stream_updates": not args.whole_rounds,
            "delay": "none added (the kernel has no netem); veth RTT is well under 1 ms",
            "reference": "none = 4 concurrent one-worker runs (ddp with one rank: no group, "
                         "no aggregator), same processes and CPU load",
        },
        "target": {"co2_ratio_at_1gbit": TARGET},
        "results": results,
    }
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
        f.write("\n")

    print(f"model: {parameters} parameters, fp32 ({parameters * 4 / 1e6:.1f} MB per round each way)")
    for res in results:
        print(f"\nlink {res['rate']} (iperf3 {res['iperf3_mbit_s']} Mbit/s): t_step {res['t_step_s']:.3f} s, "
              f"P·b/bandwidth {res['comm_s_per_round']:.3f} s; smallest τ for co2 >= {TARGET}: "
              f"measured {res['measured_min_tau']}, predicted {res['predicted_min_tau']} "
              f"(update time per round {res['update_s_per_round']:.3f} s < τ·t_step; "
              f"§8's P·b/bw < τ·t_step: {res['min_tau_section8']})")
        print(f"  {'algo':<7}{'tau':>4}{'samples/s':>11}{'ratio':>8}{'+drain':>8}{'exposed':>9}"
              f"{'predicted':>11}{'P·b/bw':>8}{'τ·t_step':>10}")
        print("  (ratio: samples/s / no communication; +drain: with co2's final wait; "
              "exposed: client's wait / training time)")
        for r in res["runs"]:
            print(f"  {r['algo']:<7}{r['tau'] or '-':>4}{r['samples_per_s']:>11.1f}{r['ratio']:>8.3f}{r['ratio_with_drain']:>8.3f}"
                  f"{100 * r['exposed_fraction']:>8.1f}%{r['predicted_ratio']:>11.3f}"
                  f"{res['comm_s_per_round']:>8.3f}{r['tau_t_step_s']:>10.3f}")
    write_plot(results, args.scratch, args.plot)
    print(f"\nwrote {args.out} and {args.plot}")


def write_plot(results, scratch, png):
    panels = []
    max_tau = max(r["tau"] or 1 for res in results for r in res["runs"])
    for i, res in enumerate(results):
        data = {}
        for algo in ("co2", "slowmo"):
            rows = [r for r in res["runs"] if r["algo"] == algo]
            path = os.path.join(scratch, f"plot-{i}-{algo}.dat")
            with open(path, "w") as f:
                for r in rows:
                    f.write(f"{r['tau']} {r['ratio']} {r['predicted_ratio']} {r['one_minus_exposed']}\n")
            data[algo] = path
        ddp = [r for r in res["runs"] if r["algo"] == "ddp"]
        ddp_ratio = ddp[0]["ratio"] if ddp else 0
        ddp_model = ddp[0]["predicted_ratio"] if ddp else 0
        panels.append(
            f"set title '{res['rate']} per worker link (iperf3 {res['iperf3_mbit_s']:.0f} Mbit/s)'\n"
            f"plot '{data['co2']}' u 1:2 w lp pt 7 lc rgb '#1b7837' t 'co2 measured', "
            f"'' u 1:3 w l dt 2 lc rgb '#1b7837' t 'co2 model', "
            f"'' u 1:4 w p pt 6 lc rgb '#1b7837' t 'co2 1 - exposed', "
            f"'{data['slowmo']}' u 1:2 w lp pt 5 lc rgb '#762a83' t 'slowmo measured', "
            f"'' u 1:3 w l dt 2 lc rgb '#762a83' t 'slowmo model', "
            f"{ddp_ratio} w l lw 2 lc rgb '#b2182b' t 'ddp (every step)', "
            f"{ddp_model} w l dt 2 lc rgb '#b2182b' t 'ddp model', "
            f"{TARGET} w l dt 3 lc rgb 'black' t '0.97'\n")
    script = (
        f"set terminal pngcairo size {560 * len(results)},420 font ',10'\n"
        f"set output '{png}'\n"
        f"set multiplot layout 1,{len(results)}\n"
        f"set logscale x 2\nset xrange [0.7:{1.4 * max_tau}]\nset xlabel 'τ (inner steps per round)'\n"
        "set ylabel 'samples/s ÷ no communication'\nset yrange [0:1.1]\n"
        "set key bottom right font ',9'\nset grid\n" + "".join(panels) + "unset multiplot\n")
    subprocess.run(["gnuplot"], input=script, text=True, check=True)


if __name__ == "__main__":
    main()
