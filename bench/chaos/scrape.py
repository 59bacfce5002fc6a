#!/usr/bin/python3
"""Scrapes the chaos benchmark's shards every second (bench/chaos/run.sh):
appends "time port name{labels} value" for every co2_aggregator_ counter
to WORK/metrics.txt until WORK/stop-scrape exists. A shard that is down
(killed, restarting) is skipped; its counters restart from 0 with it, which
analyze.py accounts for.

  scrape.py WORK PORT...
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
            "co2_aggregator_contribution_chunks_total")


def main():
    work, ports = sys.argv[1], sys.argv[2:]
    stop = os.path.join(work, "stop-scrape")
    with open(os.path.join(work, "metrics.txt"), "a") as out:
        while not os.path.exists(stop):
            for port in ports:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                                timeout=1) as r:
                        text = r.read().decode()
                except OSError:
                    continue
                t = time.time()
                for line in text.splitlines():
                    if line.startswith(COUNTERS):
                        out.write(f"{t:.3f} {port} {line}\n")
            out.flush()
            time.sleep(1)


if __name__ == "__main__":
    main()
