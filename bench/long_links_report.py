"""The long-links grid's report (bench/run_long_links.sh): one JSON with
every cell's link check, runs and shares of the link, a table on stdout
and a plot.

A round moves N workers' P floats to the shards and their update back, so
its exchange reaches a share of the link of
    (N · bytes each way per worker · 8 / rate) / round time,
with both directions of every worker link counted as running in parallel,
as iperf3's reference counts them. Gloo's all-reduce of the same floats is
compared by round time: co2 is ahead where Gloo's round takes longer.
"""

import argparse
import json
import os
import subprocess
import sys


def rate_bits(rate):
    for unit, scale in (("gbit", 1e9), ("mbit", 1e6)):
        if rate.endswith(unit):
            return float(rate[: -len(unit)]) * scale
    raise ValueError(f"unknown rate {rate!r} (Nmbit or Ngbit)")


def median(values):
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def load(path):
    with open(path) as f:
        return json.load(f)


def share(bytes_each_way, rate, seconds):
    if not seconds or seconds <= 0:
        return None
    return bytes_each_way * 8 / rate / seconds


def run_figures(report, rate):
    run = report["runs"][0]
    params = report["config"]["params"]
    per_worker = run["payload_bytes_per_round"] / run["workers"] / 2
    agg = run["aggregator"]
    out = {
        "round_s_warm": agg["round_s_median"],
        "round_s_cold": median(agg.get("first_round_s", [])),
        "share_warm": share(per_worker, rate, agg["round_s_median"]),
        "share_cold": share(per_worker, rate, median(agg.get("first_round_s", []))),
        "params": params,
    }
    iperf3 = run["iperf3"]["bytes_per_s_median"]
    if iperf3:
        out["iperf3_share"] = iperf3 * 8 / (2 * run["workers"] * rate)
    gloo = run["gloo_allreduce"]["round_s_median"]
    if gloo:
        out["gloo_round_s"] = gloo
        out["gloo_round_over_co2_round"] = gloo / agg["round_s_median"]
    return out


def cell_report(cell):
    link = load(os.path.join(cell, "link.json"))
    rate = link["asked"]["rate_mbit"] * 1e6
    entry = {"link": link, "by_shards": {}}
    emulators = [load(os.path.join(cell, f)) for f in sorted(os.listdir(cell))
                 if f.startswith("linkem-") and f.endswith(".json")]
    if emulators:
        entry["emulators"] = {
            "cpu_s": round(sum(e["cpu_s"] for e in emulators), 2),
            "packets": sum(e["packets"] for e in emulators),
            "dropped": sum(e["dropped"] for e in emulators),
            "lost_notifications": sum(e["lost_notifications"] for e in emulators),
        }
    for name in sorted(os.listdir(cell)):
        if not (name.startswith("s") and name.endswith(".json")) or "-fixed" in name:
            continue
        shards = name[1:-5]
        report = load(os.path.join(cell, name))
        figures = run_figures(report, rate)
        fixed = os.path.join(cell, f"s{shards}-fixed.json")
        if os.path.exists(fixed):
            reference = run_figures(load(fixed), rate)
            figures["fixed_1mib_window"] = {
                k: reference[k] for k in ("round_s_warm", "round_s_cold", "share_warm", "share_cold")}
            figures["warm_speedup_over_fixed_window"] = (
                reference["round_s_warm"] / figures["round_s_warm"])
        figures["report"] = report
        entry["by_shards"][shards] = figures
    return entry


def fmt(x, digits=2):
    return "—" if x is None else f"{x:.{digits}f}"


def table(cells):
    rows = ["| rate | RTT ms | loss | S | ping ms | share warm | cold | "
            "fixed 1 MiB window | iperf3 | Gloo round / co2 round |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in cells:
        asked, measured = c["link"]["asked"], c["link"]["measured"]
        for shards, f in sorted(c["by_shards"].items()):
            fixed = f.get("fixed_1mib_window", {})
            rows.append(
                f"| {asked['rate_mbit']:g} Mbit/s | {asked['rtt_ms']:g} | "
                f"{asked['loss'] * 100:g} % | {shards} | {measured['ping_rtt_ms']:.1f} | "
                f"**{fmt(f['share_warm'])}** | {fmt(f['share_cold'])} | "
                f"{fmt(fixed.get('share_warm'))} | {fmt(f.get('iperf3_share'))} | "
                f"{fmt(f.get('gloo_round_over_co2_round'))} |")
    return "\n".join(rows)


def plot(cells, path):
    """One panel per rate: the warm share against the round trip, per loss
    and S, with the fixed 1 MiB window dashed."""
    rates = sorted({c["link"]["asked"]["rate_mbit"] for c in cells})
    data = path + ".dat"
    script = [f"set terminal pngcairo size {560 * len(rates)},520",
              f"set output '{path}'", f"set multiplot layout 1,{len(rates)}",
              "set xlabel 'round trip (ms)'", "set ylabel 'share of the link, warm round'",
              "set yrange [0:1.05]", "set key bottom left font ',9'"]
    index = 0
    with open(data, "w") as out:
        for rate in rates:
            plots = []
            lines = {}
            for c in cells:
                asked = c["link"]["asked"]
                if asked["rate_mbit"] != rate:
                    continue
                for shards, f in c["by_shards"].items():
                    fixed = f.get("fixed_1mib_window", {}).get("share_warm")
                    lines.setdefault((asked["loss"], shards), []).append(
                        (asked["rtt_ms"], f["share_warm"] or 0, fixed or 0))
            for (loss, shards), points in sorted(lines.items()):
                for rtt, warm, fixed in sorted(points):
                    out.write(f"{rtt} {warm} {fixed}\n")
                out.write("\n\n")
                title = f"loss {loss * 100:g} %, S={shards}"
                plots.append(f"'{data}' index {index} using 1:2 with linespoints lw 2 title '{title}'")
                plots.append(f"'{data}' index {index} using 1:3 with lines dashtype 2 "
                             f"title '{title}, fixed 1 MiB window'")
                index += 1
            script.append(f"set title '{rate:g} Mbit/s per worker'")
            script.append("plot " + ", ".join(plots))
    script.append("unset multiplot")
    subprocess.run(["gnuplot"], input="\n".join(script), text=True, check=True)
    os.remove(data)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--plot")
    parser.add_argument("--command", default="bench/run_long_links.sh")
    parser.add_argument("--hosts", default="tuned")
    parser.add_argument("--replot", action="store_true",
                        help="plot --out's cells again, reading no run")
    parser.add_argument("cells", nargs="*")
    args = parser.parse_args()
    if args.replot:
        cells = load(args.out)["cells"]
        print(table(cells))
        plot(cells, args.plot)
        return
    cells = [cell_report(c) for c in args.cells]
    report = {"command": args.command, "hosts": args.hosts, "cells": cells}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(table(cells))
    if args.plot:
        plot(cells, args.plot)
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
