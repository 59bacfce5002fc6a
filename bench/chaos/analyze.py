#!/usr/bin/python3
"""Summarises a chaos benchmark run (bench/chaos/run.sh): goodput, time to
heal per fault, rounds closed at their deadline and final accuracy, the
chaos run against the undisturbed one. Writes the JSON (--out) and prints a
table. Standard library only.

  analyze.py WORK --minutes=M --seed=S --t_free=T --t_chaos=T --out=FILE

Time to heal, per fault (from the fault's end: the kill, the SIGCONT, the
link coming back; a shard kill from the kill):
  worker_kill  until the restarted worker logs that it joined the job
  worker_stop  until the job closes a round after the SIGCONT, or until the
               worker logs that it healed, whichever is later
  link_cut     as worker_stop, from the link coming back
  shard_kill   until the job closes a round after the shard is back

Contributions: the workers' pushes (co2_worker_rounds_total) against what
each shard counted (co2_aggregator_contributions_total), both scraped every
second and summed across restarts.
"""
import argparse
import datetime
import glob
import json
import os
import re
import statistics
import subprocess

TAU = 16
BATCH = 32
SHARD_PORTS = (19460, 19461)
LOG_TIME = re.compile(r"^[IWE](\d\d)(\d\d) (\d\d):(\d\d):(\d\d\.\d+) ")


def log_times(path, pattern, year):
    """Unix times of the lines of `path` that contain `pattern`."""
    times = []
    if not os.path.exists(path):
        return times
    with open(path, errors="replace") as f:
        for line in f:
            m = LOG_TIME.match(line)
            if m and pattern in line:
                mo, d, h, mi, s = m.groups()
                t = datetime.datetime(year, int(mo), int(d), int(h), int(mi),
                                      tzinfo=datetime.timezone.utc).timestamp()
                times.append(t + float(s))
    return times


def timeline(work, job):
    points = []
    path = os.path.join(work, f"timeline-{job}.txt")
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2:
                    points.append((float(parts[0]), int(parts[1])))
    return points


def next_round_after(points, t):
    """When worker 0 first finished a round after time t (None if never)."""
    before = max([r for (u, r) in points if u <= t], default=0)
    for u, r in points:
        if u > t and r > before:
            return u
    return None


def counter_increase(work, name, job, t0, t1, port=None):
    """Sum over processes (or only the one at `port`) of the counter's
    increase in [t0, t1], across restarts: a job's series starts at 0 with
    the job, and a value below the last one is a restarted process's count
    from 0."""
    total = 0.0
    last = {}
    path = os.path.join(work, "metrics.txt")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        for line in f:
            t, where, series, value = line.split(" ", 3)
            if not series.startswith(name) or f'co2_job="{job}"' not in series:
                continue
            if port is not None and not where.endswith(f":{port}"):
                continue
            t, value = float(t), float(value)
            if t < t0 or t > t1:
                continue
            key = (where, series)
            prev = last.get(key, 0.0)
            total += value - prev if value >= prev else value
            last[key] = value
    return total


def pct(values, q):
    if not values:
        return None
    values = sorted(values)
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return round(values[lo] + (values[hi] - values[lo]) * (k - lo), 2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("work")
    ap.add_argument("--minutes", type=float, required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--t_free", type=float, required=True)
    ap.add_argument("--t_chaos", type=float, required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    work = a.work
    year = datetime.datetime.now(datetime.timezone.utc).year
    reports = {job: json.load(open(os.path.join(work, f"{job}.json")))
               for job in ("free", "chaos")}
    chaos_points = timeline(work, "chaos")

    faults = []
    with open(os.path.join(work, "events.txt")) as f:
        for line in f:
            t1, t2, kind, target = line.split()
            t1, t2 = float(t1), float(t2)
            healed = None
            if kind == "worker_kill":
                w = target.split("-")[1]
                joined = [t for t in log_times(
                    os.path.join(work, f"run-chaos/rank-{w}-0.log"),
                    "joined job", year) if t > t1]
                healed = joined[0] if joined else None
            elif kind in ("worker_stop", "link_cut"):
                w = target.split("-")[1]
                round_at = next_round_after(chaos_points, t2)
                heal = [t for t in log_times(
                    os.path.join(work, f"run-chaos/rank-{w}-0.log"),
                    "healed (", year) if t > t2]
                candidates = [t for t in (round_at, heal[0] if heal else None) if t]
                healed = max(candidates) if candidates else None
            else:
                healed = next_round_after(chaos_points, t2)
            start = t1 if kind == "shard_kill" else t2
            faults.append(dict(kind=kind, target=target,
                               at_s=round(t1 - a.t_chaos, 1),
                               lasted_s=round(t2 - t1, 1),
                               time_to_heal_s=None if healed is None
                               else round(healed - start, 2)))

    def contributions(job, t0, t1):
        return counter_increase(work, "co2_aggregator_contributions_total", job, t0, t1)

    summary = {}
    for job, t0 in (("free", a.t_free), ("chaos", a.t_chaos)):
        r = reports[job]
        t1 = t0 + r["wall_time_s"] + 5
        contrib = contributions(job, t0, t1)
        # Each shard counts every contribution: the mean over the 2 shards.
        samples = contrib / 2 * TAU * BATCH if contrib is not None else None
        summary[job] = dict(
            wall_s=round(r["wall_time_s"], 1),
            rounds=r["rounds"],
            contributions=None if contrib is None else contrib / 2,
            samples_per_s=None if samples is None else round(samples / r["wall_time_s"], 1),
            test_accuracy=r["final_metrics"].get("test_accuracy"),
            params_identical=r["params_identical"],
            rounds_closed_at_deadline=counter_increase(
                work, "co2_aggregator_quorum_closes_total", job, t0, t1),
            duplicate_chunks=counter_increase(
                work, "co2_aggregator_duplicate_chunks_total", job, t0, t1),
            late_chunks=counter_increase(
                work, "co2_aggregator_late_chunks_total", job, t0, t1),
            pushed=counter_increase(work, "co2_worker_rounds_total", job, t0, t1),
            counted_by_shard=[counter_increase(
                work, "co2_aggregator_contributions_total", job, t0, t1, port)
                for port in SHARD_PORTS])
    free, chaos = summary["free"], summary["chaos"]
    goodput = (chaos["samples_per_s"] / free["samples_per_s"]
               if chaos["samples_per_s"] and free["samples_per_s"] else None)
    def heals(kinds):
        return [f["time_to_heal_s"] for f in faults
                if f["kind"] in kinds and f["time_to_heal_s"] is not None]

    worker_heals = heals(("worker_kill", "worker_stop"))
    shard_heals = heals(("shard_kill",))
    link_heals = heals(("link_cut",))
    result = dict(
        benchmark="chaos", minutes=a.minutes, seed=a.seed,
        machine=dict(cpus=os.cpu_count()),
        git=subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                           capture_output=True, text=True).stdout.strip(),
        command=f"sudo bench/chaos/run.sh build {a.minutes:g} {a.seed}",
        goodput=None if goodput is None else round(goodput, 3),
        time_to_heal_s=dict(
            worker=dict(p50=pct(worker_heals, 0.5), p99=pct(worker_heals, 0.99),
                        count=len(worker_heals)),
            shard=dict(p50=pct(shard_heals, 0.5), p99=pct(shard_heals, 0.99),
                       count=len(shard_heals)),
            link=dict(p50=pct(link_heals, 0.5), p99=pct(link_heals, 0.99),
                      count=len(link_heals))),
        accuracy_delta=(None if chaos["test_accuracy"] is None
                        else round(chaos["test_accuracy"] - free["test_accuracy"], 4)),
        free=free, chaos=chaos, faults=faults,
        unhealed=[f for f in faults if f["time_to_heal_s"] is None])
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"goodput {result['goodput']} (chaos {chaos['samples_per_s']} samples/s, "
          f"undisturbed {free['samples_per_s']})")
    print(f"time to heal: workers p50 {result['time_to_heal_s']['worker']['p50']} s, "
          f"p99 {result['time_to_heal_s']['worker']['p99']} s "
          f"({len(worker_heals)}); shards p50 {result['time_to_heal_s']['shard']['p50']} s, "
          f"p99 {result['time_to_heal_s']['shard']['p99']} s ({len(shard_heals)}); "
          f"link p50 {result['time_to_heal_s']['link']['p50']} s, "
          f"p99 {result['time_to_heal_s']['link']['p99']} s ({len(link_heals)})")
    print(f"rounds closed at their deadline: {chaos['rounds_closed_at_deadline']} "
          f"(undisturbed {free['rounds_closed_at_deadline']})")
    print(f"test accuracy {chaos['test_accuracy']} against {free['test_accuracy']}")
    print(f"contributions: workers pushed {chaos['pushed']}, shards counted "
          f"{chaos['counted_by_shard']} (undisturbed {free['pushed']}, "
          f"{free['counted_by_shard']})")
    for f_ in faults:
        print(f"  {f_['at_s']:7.1f} s  {f_['kind']:12} {f_['target']:9} "
              f"heal {f_['time_to_heal_s']}")


if __name__ == "__main__":
    main()
