#!/usr/bin/python3
"""Scrapes the chaos benchmark's shards and workers every second
(bench/chaos/run.sh): appends "time host:port name{labels} value" for the
counters below to WORK/metrics.txt until WORK/stop-scrape exists. A
process that is down (killed, restarting, cut off) is skipped; its
counters restart from 0 with it, which analyze.py accounts for.

  scrape.py WORK HOST:PORT...
"""
import os
import sys
import time
import urllib.request

COUNTERS = ("co2_aggregator_quorum_closes_total",
            "co2_aggregator_contributions_total",
            "co2_aggregator_rounds_completed_total",
            "co2_aggregator_duplicate_chunks_total",
            "co2_aggregator_late_chunks_total",
            "co2_aggregator_contribution_chunks_total",
            "co2_worker_rounds_total")


def main():
    work, targets = sys.argv[1], sys.argv[2:]
    stop = os.path.join(work, "stop-scrape")
    with open(os.path.join(work, "metrics.txt"), "a") as out:
        while not os.path.exists(stop):
            for target in targets:
                try:
                    with urllib.request.urlopen(f"http://{target}/metrics",
                                                timeout=0.5) as r:
                        text = r.read().decode()
                except OSError:
                    continue
                t = time.time()
                for line in text.splitlines():
                    if line.startswith(COUNTERS):
                        out.write(f"{t:.3f} {target} {line}\n")
            out.flush()
            time.sleep(1)


if __name__ == "__main__":
    main()
